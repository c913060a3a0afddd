"""Definitions: workflow and step validation, all without a database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from tests.conftest import StatementCounter


def noop(ctx: cyclone.StepContext, value: Any) -> None:
    return None


@pytest.fixture
def database_activity() -> Iterator[list[str]]:
    """Every connect and statement, on any Engine, made by this thread."""
    seen: list[str] = []
    me = threading.get_ident()

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.get_ident() == me:
            seen.append(statement)

    def on_connect(dbapi_conn: Any, record: Any) -> None:
        if threading.get_ident() == me:
            seen.append("<connect>")

    sa.event.listen(sa.Engine, "before_cursor_execute", on_execute)
    sa.event.listen(sa.pool.Pool, "connect", on_connect)
    sa.event.listen(sa.pool.Pool, "checkout", on_connect)
    yield seen
    sa.event.remove(sa.Engine, "before_cursor_execute", on_execute)
    sa.event.remove(sa.pool.Pool, "connect", on_connect)
    sa.event.remove(sa.pool.Pool, "checkout", on_connect)


def test_duplicate_step_name_raises(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("a")(noop)
    with pytest.raises(cyclone.DefinitionError, match="defined twice"):
        wf.step("a")(noop)
    assert list(wf.steps) == ["a"]


def test_duplicate_result_and_step_name_raises(name: str) -> None:
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name)
    wf.step("a")(noop)
    with pytest.raises(cyclone.DefinitionError, match="defined twice"):
        wf.result("a")(noop)


def test_unknown_dependency_raises_at_graph_and_submit(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("a", after=["never_defined"])(noop)  # a forward reference is allowed here
    with pytest.raises(cyclone.DefinitionError, match="unknown step 'never_defined'"):
        wf.graph()
    statements.reset()
    with pytest.raises(cyclone.DefinitionError, match="unknown step 'never_defined'"):
        wf.submit_once(engine, "k", 1)
    with pytest.raises(cyclone.DefinitionError, match="unknown step 'never_defined'"):
        wf.submit(engine, 1)
    assert statements.count == 0


def test_a_step_from_another_workflow_in_after_raises(name: str) -> None:
    other: cyclone.Workflow[Any] = cyclone.Workflow(name + "_other")
    foreign = other.step("a")(noop)
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("a")(noop)
    with pytest.raises(cyclone.DefinitionError, match="belongs to workflow"):
        wf.step("b", after=[foreign])(noop)
    assert list(wf.steps) == ["a"]


def test_after_with_a_non_step_raises(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    with pytest.raises(cyclone.DefinitionError, match="after= takes steps or step names"):
        wf.step("a", after=[42])(noop)  # type: ignore[list-item]


def test_a_cycle_through_string_forward_refs_raises_at_decoration(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(after=["b"])
    def a(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    with pytest.raises(cyclone.DefinitionError, match="cycle"):

        @wf.step(after=[a])
        def b(ctx: cyclone.StepContext, value: Any) -> None:
            return None

    # The rejected step is not kept: the workflow is as it was before the decoration.
    assert list(wf.steps) == ["a"]


def test_a_longer_cycle_names_its_path(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("a", after=["c"])(noop)
    wf.step("b", after=["a"])(noop)
    with pytest.raises(cyclone.DefinitionError, match=r"cycle: a -> c -> b -> a"):
        wf.step("c", after=["b"])(noop)
    assert list(wf.steps) == ["a", "b"]


def test_a_step_after_itself_raises(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    with pytest.raises(cyclone.DefinitionError, match="after itself"):
        wf.step("a", after=["a"])(noop)


def test_two_result_nodes_raise(name: str) -> None:
    wf: cyclone.ResultWorkflow[Any, int] = cyclone.ResultWorkflow(name, output=int)
    wf.result("first")(noop)
    with pytest.raises(cyclone.DefinitionError, match="result node already"):
        wf.result("second")(noop)
    assert list(wf.steps) == ["first"]


def test_a_result_node_may_be_the_only_step(name: str) -> None:
    wf: cyclone.ResultWorkflow[Any, int] = cyclone.ResultWorkflow(name, output=int)
    wf.result("only")(noop)
    graph = wf.graph()
    assert graph.result == "only"
    assert [node.name for node in graph.steps] == ["only"]


def test_result_workflow_without_result_node_raises_at_submit(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf: cyclone.ResultWorkflow[Any, int] = cyclone.ResultWorkflow(name, output=int)
    wf.step("a")(noop)
    statements.reset()
    with pytest.raises(cyclone.DefinitionError, match="no result node"):
        wf.submit_once(engine, "k", 1)
    with pytest.raises(cyclone.DefinitionError, match="no result node"):
        wf.submit(engine, 1)
    assert statements.count == 0


def test_a_workflow_without_steps_raises_at_submit(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    statements.reset()
    with pytest.raises(cyclone.DefinitionError, match="no steps"):
        wf.submit_once(engine, "k", 1)
    assert statements.count == 0


def test_step_decorator_without_parentheses_raises(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    with pytest.raises(cyclone.DefinitionError, match="parentheses"):
        wf.step(noop)  # type: ignore[arg-type]
    with pytest.raises(cyclone.DefinitionError, match="kind name"):
        cyclone.step(noop)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"queue": ""},
        {"priority": 40000},
        {"max_attempts": "3"},
        {"max_attempts": True},
        {"max_attempts": 2**31},
    ],
)
def test_bad_step_options_raise(name: str, options: dict[str, Any]) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    with pytest.raises(cyclone.DefinitionError):
        wf.step("a", **options)(noop)
    with pytest.raises(cyclone.DefinitionError):
        cyclone.step(name, **options)(noop)


def test_a_workflow_name_must_be_a_non_empty_str() -> None:
    with pytest.raises(cyclone.DefinitionError):
        cyclone.Workflow("")
    with pytest.raises(cyclone.DefinitionError):
        cyclone.Workflow(None)  # type: ignore[arg-type]


def test_graph_orders_steps_roots_first(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("c", after=["b", "a"])(noop)
    wf.step("b", after=["a"])(noop)
    wf.step("a")(noop)
    graph = wf.graph()
    assert [node.name for node in graph.steps] == ["a", "b", "c"]
    assert graph.result is None


def test_step_output_type_comes_from_the_return_annotation(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def a(ctx: cyclone.StepContext, value: Any) -> list[int]:
        return [1]

    assert a.output_type == list[int]
    assert a(None, 0) == [1]  # type: ignore[arg-type]


def test_defining_touches_no_database(name: str, database_activity: list[str]) -> None:
    wf: cyclone.ResultWorkflow[Any, int] = cyclone.ResultWorkflow(name, input=int, output=int)

    @wf.step(max_attempts=5, queue="q", priority=-1)
    def a(ctx: cyclone.StepContext, value: int) -> int:
        return value

    @wf.step(after=[a, "a2"])
    def b(ctx: cyclone.StepContext, value: int) -> int:
        return value

    wf.step("a2")(noop)

    @wf.result(after=[b])
    def total(ctx: cyclone.StepContext, value: int) -> int:
        return value

    @cyclone.step(name + ".email", max_attempts=2)
    def email(ctx: cyclone.StepContext, args: str) -> None:
        return None

    assert wf.graph().result == "total"
    assert wf.plan().step_count == 4
    assert database_activity == []


def test_max_attempts_past_the_integer_column_is_refused_before_a_run_exists(
    engine: sa.Engine, name: str
) -> None:
    """``cyclone_jobs.max_attempts`` is a PostgreSQL ``integer``. A larger value was taken
    at definition and by ``enqueue(max_attempts=)``: the enqueue failed with the driver's
    ``DataError``, and a workflow's run was submitted, then made every claim of a worker
    serving it fail, for every workflow it served, forever."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    with pytest.raises(cyclone.DefinitionError, match="max_attempts must be an int from 1"):
        wf.step(max_attempts=2**31)(noop)

    @cyclone.step(name)
    def kind(ctx: cyclone.StepContext, args: Any) -> None:
        return None

    with pytest.raises(ValueError, match="max_attempts= must be from 1 to 2147483647"):
        kind.enqueue(engine, None, max_attempts=2**31)
    assert cyclone.Client(engine).list_jobs(kind=name) == []
    job = kind.enqueue(engine, None, max_attempts=2**31 - 1)
    assert job.status().max_attempts == 2**31 - 1
    job.cancel()
