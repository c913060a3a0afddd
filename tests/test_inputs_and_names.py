"""Inputs that are not JSON are refused; names are checked at definition and reach SQL intact."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone import _codec
from cyclone.schema import jobs, runs
from cyclone.workflow import MAX_NAME_LENGTH

HOSTILE = [
    "o'brien",
    'say "hi"',
    "back\\slash\\",
    "100%",
    "%(key)s and %s",
    "ünïcødé 名前 🚀",
    "E'\\x00'",
    "$1 ?",
]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


class Reading(msgspec.Struct):
    value: float


def count(engine: sa.Engine, table: sa.Table, column: sa.Column[Any], name: str) -> int:
    with engine.connect() as conn:
        stmt = sa.select(sa.func.count()).select_from(table).where(column == name)
        return int(conn.execute(stmt).scalar_one())


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("a\x00b", "NUL"),
        ("", "non-empty"),
        ("lone \ud800", "UTF-8"),
        ("x" * (MAX_NAME_LENGTH + 1), f"at most {MAX_NAME_LENGTH}"),
        (42, "non-empty str"),
    ],
    ids=["nul", "empty", "surrogate", "too-long", "not-str"],
)
def test_a_bad_name_is_a_definition_error_at_definition(bad: Any, reason: str) -> None:
    with pytest.raises(cyclone.DefinitionError, match=reason):
        cyclone.Workflow(bad)
    wf = cyclone.Workflow("fine")
    with pytest.raises(cyclone.DefinitionError, match=reason):
        wf.step(bad)(lambda ctx, value: None)
    assert wf.steps == {}
    with pytest.raises(cyclone.DefinitionError, match=reason):
        cyclone.Workflow("fine", queue=bad)
    with pytest.raises(cyclone.DefinitionError, match=reason):
        wf.step("s", queue=bad)(lambda ctx, value: None)
    with pytest.raises(cyclone.DefinitionError, match=reason):
        cyclone.step(bad)(lambda ctx, args: None)
    with pytest.raises(cyclone.DefinitionError, match=reason):
        cyclone.step("kind", queue=bad)(lambda ctx, args: None)


def test_a_name_of_the_longest_length_is_accepted() -> None:
    longest = "n" * MAX_NAME_LENGTH
    wf = cyclone.Workflow(longest, queue=longest)
    wf.step(longest)(lambda ctx, value: None)
    wf.plan()


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_names_round_trip_through_submit_claim_and_notification(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    unique = f"{name} {id(name)} {math.pi}"
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(
        f"wf {unique}", output=int, queue=f"q {unique}"
    )

    @wf.step(f"first {unique}")
    def first(ctx: cyclone.StepContext, value: int) -> int:
        return value + 1

    @wf.result(f"last {unique}", after=[first])
    def last(ctx: cyclone.StepContext, value: int) -> int:
        return ctx.output(first) * 10

    @cyclone.step(f"kind {unique}", queue=f"kq {unique}")
    def kind(ctx: cyclone.StepContext, args: str) -> str:
        return args

    run, created = wf.submit_once(engine, unique, 1)
    assert created
    (again, _created), (other, _) = wf.submit_once_many(engine, [(unique, 1), (f"{unique}2", 2)])
    assert again.id == run.id
    conninfo = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as driver:
        joined = wf.submit_tx(driver, 3)
        job = kind.enqueue_tx(driver, name, unique=unique)
    with cyclone.Worker(engine, workflows=[wf], steps=[kind]) as worker:
        assert worker.drain() == 7
    assert run.result(timeout=10) == 20
    assert other.result(timeout=10) == 30
    assert joined.result(timeout=10) == 40
    assert job.result(timeout=10) == name
    assert count(engine, runs, runs.c.workflow, wf.name) == 3
    assert count(engine, jobs, jobs.c.kind, f"first {unique}") == 3
    assert count(engine, jobs, jobs.c.queue, f"q {unique}") == 6
    assert count(engine, jobs, jobs.c.kind, kind.kind) == 1


NON_FINITE = [
    pytest.param(float("nan"), id="nan"),
    pytest.param({"x": float("inf")}, id="inf"),
    pytest.param([1.0, {"deep": [-math.inf]}], id="nested-minus-inf"),
    pytest.param(Reading(float("nan")), id="struct"),
]


@pytest.mark.parametrize("value", NON_FINITE)
def test_nan_and_infinities_are_refused_and_nothing_is_written(
    engine: sa.Engine, name: str, value: Any
) -> None:
    wf = cyclone.Workflow(name)
    wf.step("s")(lambda ctx, v: None)

    @cyclone.step(name)
    def kind(ctx: cyclone.StepContext, args: Any) -> None:
        return None

    calls = [
        lambda: wf.submit(engine, value),
        lambda: wf.submit_once(engine, "k", value),
        lambda: wf.submit_once_many(engine, [("a", 1), ("b", value)]),
        lambda: kind.enqueue(engine, value),
    ]
    for call in calls:
        with pytest.raises(cyclone.InputError, match=r"NaN or an infinity.*JSON has no value"):
            call()
    with (
        engine.connect() as conn,
        conn.begin(),
        pytest.raises(cyclone.InputError, match="JSON has no value"),
    ):
        wf.submit_once_tx(conn, "k", value)
    assert count(engine, runs, runs.c.workflow, name) == 0
    assert count(engine, jobs, jobs.c.kind, name) == 0


def test_none_and_a_null_string_are_still_fine(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    wf.step("s")(lambda ctx, v: None)
    none_run, _ = wf.submit_once(engine, "none", {"x": None})
    text_run, _ = wf.submit_once(engine, "text", {"x": "null", "y": 1.5})
    assert none_run.id != text_run.id


def test_a_step_output_of_nan_fails_the_step_instead_of_storing_null(
    engine: sa.Engine, name: str
) -> None:
    @cyclone.step(name, max_attempts=1)
    def kind(ctx: cyclone.StepContext, args: int) -> float:
        return float("nan")

    job = kind.enqueue(engine, 1)
    with cyclone.Worker(engine, steps=[kind]) as worker:
        worker.drain()
    status = job.wait(timeout=10)
    assert status.state == cyclone.JobState.FAILED
    assert "JSON has no value" in status.errors[-1]["message"]


def test_ctx_output_given_a_steps_name_fails_the_step_saying_to_pass_the_step(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def first(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @wf.step(after=[first], max_attempts=1)
    def second(ctx: cyclone.StepContext, n: int) -> int:
        value: int = ctx.output("first")  # type: ignore[arg-type]
        return value

    run = wf.submit(engine, 1)
    cyclone.Worker(engine, workflows=[wf]).drain()
    status = run.wait(timeout=10)
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert status.error["type"] == "TypeError"
    assert status.error["message"] == (
        "ctx.output takes an upstream step (the decorated function), not str: "
        "ctx.output('first') in step 'second'"
    )


def test_too_deep_an_input_is_an_input_error_naming_the_limit(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    wf.step("s")(lambda ctx, v: None)
    with pytest.raises(cyclone.InputError, match=r"nested too deeply.*recursion limit"):
        wf.submit_once(engine, "k", nested(10_000))
    typed = cyclone.Workflow(f"{name}_typed", input=list[Any])
    typed.step("s")(lambda ctx, v: None)
    with pytest.raises(cyclone.InputError, match="nested too deeply"):
        typed.submit(engine, nested(10_000))
    assert count(engine, runs, runs.c.workflow, name) == 0


def test_too_large_an_input_is_an_input_error_naming_the_limit(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    wf.step("s")(lambda ctx, v: None)
    with pytest.raises(cyclone.InputError, match=f"at most {_codec.MAX_BYTES} allowed"):
        wf.submit_once(engine, "k", "x" * _codec.MAX_BYTES)
    assert count(engine, runs, runs.c.workflow, name) == 0
