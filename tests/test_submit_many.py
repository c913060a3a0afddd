"""submit_once_many: one (run, created) per item, in order, under the submit_once rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cyclone
from tests.conftest import StatementCounter
from tests.support.factories import (
    Order,
    count_jobs,
    count_runs,
    job_kinds,
    result_workflow,
    run_ids,
    workflow,
)


def test_one_result_per_item_in_input_order(engine: sa.Engine, name: str) -> None:
    wf = workflow(name, 2)
    keys = [f"k{i}" for i in (5, 3, 9, 1, 7)]
    results = wf.submit_once_many(engine, [(key, {"key": key}) for key in keys])
    assert [run.key for run, _ in results] == keys
    assert all(created for _, created in results)
    assert all(run.workflow == name for run, _ in results)
    assert len({run.id for run, _ in results}) == len(keys)
    for run, _ in results:
        assert run.status().key == run.key
        assert job_kinds(engine, run.id) == ["s0", "s1"]
    assert count_jobs(engine, name) == 2 * len(keys)


def test_an_empty_batch_returns_nothing(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    statements.reset()
    assert workflow(name).submit_once_many(engine, []) == []
    assert statements.count == 0


def test_duplicates_within_the_batch_get_the_same_run(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    results = wf.submit_once_many(engine, [("a", 1), ("b", 2), ("a", 1), ("a", 1.0), ("b", 2)])
    created = [c for _, c in results]
    assert created == [True, True, False, False, False]
    ids = [run.id for run, _ in results]
    assert ids[0] == ids[2] == ids[3]
    assert ids[1] == ids[4]
    assert ids[0] != ids[1]
    assert count_runs(engine, name) == 2


def test_an_existing_key_returns_created_false(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    existing, _ = wf.submit_once(engine, "old", {"n": 1})
    results = wf.submit_once_many(engine, [("new", {"n": 2}), ("old", {"n": 1})])
    assert [c for _, c in results] == [True, False]
    assert results[1][0].id == existing.id
    again = wf.submit_once_many(engine, [("new", {"n": 2}), ("old", {"n": 1})])
    assert [c for _, c in again] == [False, False]
    assert [r.id for r, _ in again] == [r.id for r, _ in results]


def test_a_conflicting_item_raises_and_nothing_from_the_batch_is_inserted(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name, 2)
    existing, _ = wf.submit_once(engine, "old", {"n": 1})
    with pytest.raises(cyclone.SubmitConflictError) as info:
        wf.submit_once_many(engine, [("new1", {"n": 1}), ("old", {"n": 2}), ("new2", {"n": 3})])
    assert (info.value.run_id, info.value.workflow, info.value.key) == (existing.id, name, "old")
    assert run_ids(engine, name) == {existing.id}
    assert count_jobs(engine, name) == 2


def test_a_conflict_within_the_batch_raises_and_nothing_is_inserted(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    with pytest.raises(cyclone.SubmitConflictError) as info:
        wf.submit_once_many(engine, [("a", 1), ("b", 1), ("a", 2)])
    assert info.value.key == "a"
    assert count_runs(engine, name) == 0
    assert count_jobs(engine, name) == 0


def test_inputs_are_compared_as_jsonb(engine: sa.Engine, name: str) -> None:
    wf = workflow(name, input=Order)
    first, _ = wf.submit_once(engine, "k", Order(id=1, amount=2))
    [(run, created)] = wf.submit_once_many(engine, [("k", {"amount": 2, "id": 1})])
    assert (run.id, created) == (first.id, False)


def test_options_apply_to_new_runs_only(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    deadline = datetime(2100, 1, 1, tzinfo=UTC)
    old, _ = wf.submit_once(engine, "old", 1, retention=timedelta(days=1))
    results = wf.submit_once_many(
        engine, [("old", 1), ("new", 1)], deadline=deadline, retention=timedelta(days=9)
    )
    assert [c for _, c in results] == [False, True]
    assert old.status().retention == timedelta(days=1)
    assert old.status().deadline is None
    new = results[1][0].status()
    assert (new.deadline, new.retention) == (deadline, timedelta(days=9))


def test_a_result_workflow_batch_returns_result_run_handles(engine: sa.Engine, name: str) -> None:
    wf = result_workflow(name)
    [(run, created)] = wf.submit_once_many(engine, [("k", 1)])
    assert created
    assert isinstance(run, cyclone.ResultRun)


def test_keys_are_per_workflow_name_in_a_batch(engine: sa.Engine, name: str) -> None:
    one = workflow(name + "_one")
    two = workflow(name + "_two")
    [(a, _)] = one.submit_once_many(engine, [("k", 1)])
    [(b, created)] = two.submit_once_many(engine, [("k", 2)])
    assert created
    assert a.id != b.id


def test_a_batch_of_100_is_one_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name, 5)
    wf.plan()
    items = [(f"k{i}", {"i": i}) for i in range(100)]
    statements.reset()
    results = wf.submit_once_many(engine, items)
    assert statements.count == 1, statements.statements
    assert all(created for _, created in results)
    statements.reset()
    again = wf.submit_once_many(engine, items)
    assert statements.count == 1, statements.statements
    assert not any(created for _, created in again)
    assert count_jobs(engine, name) == 500


def test_batch_statements_do_not_grow_with_the_steps(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    counts = []
    for steps in (1, 20):
        wf = workflow(f"{name}_{steps}", steps)
        statements.reset()
        wf.submit_once_many(engine, [(f"k{i}", i) for i in range(10)])
        counts.append(statements.count)
    assert counts == [1, 1]


def test_overlapping_batches_in_opposite_orders_do_not_deadlock(
    engine: sa.Engine, name: str
) -> None:
    import threading

    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: int) -> None:
        return None

    items = [(f"k{i}", i) for i in range(1000)]
    barrier = threading.Barrier(2, timeout=30)
    results: dict[str, list[tuple[cyclone.Run, bool]]] = {}
    errors: list[BaseException] = []

    def submit(label: str, batch: list[tuple[str, int]]) -> None:
        try:
            barrier.wait()
            results[label] = wf.submit_once_many(engine, batch)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=submit, args=("forward", items)),
        threading.Thread(target=submit, args=("backward", items[::-1])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    forward = {run.key: run.id for run, _ in results["forward"]}
    backward = {run.key: run.id for run, _ in results["backward"]}
    assert forward == backward
    created = sum(c for _, c in results["forward"]) + sum(c for _, c in results["backward"])
    assert created == len(items)
