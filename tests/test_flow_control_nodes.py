"""Limits on map and child nodes: ``@wf.map(concurrency=|rate=)`` bounds each item's job,
``@wf.child(concurrency=|rate=)`` the child node's attempts, their keys evaluated on the
run's input at submit, as a step's.

The multi-process test samples the running items per key from the database while worker
processes (tests/support/flow_proc.py) serve; the others run workers in this process.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone.schema import jobs, runs
from tests.conftest import wait_until
from tests.support.factories import starts_per_second
from tests.support.flow_proc import map_workflow
from tests.test_flow_control import asleep, spawn, stop

RUNNING_ITEMS = (
    "SELECT limit_key, count(*) FROM cyclone_jobs WHERE state = 'running' "
    "AND limit_name = :n AND item IS NOT NULL GROUP BY limit_key"
)
RUNNING = (
    "SELECT limit_key, count(*) FROM cyclone_jobs WHERE state = 'running' "
    "AND limit_name = :n GROUP BY limit_key"
)


def sample(
    engine: sa.Engine, query: str, limit: str, done: Any, timeout: float = 90.0
) -> Counter[str]:
    """The most seen at once per key by ``query``, sampled until ``done()``."""
    most: Counter[str] = Counter()

    def check() -> bool:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(query), {"n": limit}).all()
        for key, n in rows:
            most[key] = max(most[key], n)
        return bool(done())

    wait_until(check, timeout=timeout, interval=0.005)
    return most


def all_ended(runs: list[Any]) -> Any:
    return lambda: all(run.status().state != "running" for run in runs)


def test_a_maps_running_items_per_key_never_exceed_max_across_worker_processes(
    engine: sa.Engine, name: str
) -> None:
    spec = {"limit": "map", "max": 3, "concurrency": 4}
    wf = map_workflow(name, spec)
    runs = [wf.submit(engine, {"k": k, "n": 15, "ms": 20}) for k in ("a", "a", "b")]
    procs = [spawn(name, spec) for _ in range(2)]
    try:
        most = sample(engine, RUNNING_ITEMS, f"step:{name}.each", all_ended(runs))
    finally:
        stop(procs)
    assert set(most) == {"a", "b"}
    assert max(most.values()) == 3, most
    for run in runs:
        # Each item ran with its own item as input, claimed through the limited claim.
        assert run.result(timeout=10) == list(range(15))
    with engine.connect() as conn:
        unlimited = conn.execute(
            sa.text(
                "SELECT count(*) FROM cyclone_jobs WHERE workflow = :w AND item IS NOT NULL "
                "AND (limit_name IS DISTINCT FROM :n OR limit_key NOT IN ('a', 'b'))"
            ),
            {"w": name, "n": f"step:{name}.each"},
        ).scalar_one()
    assert unlimited == 0


def test_a_rate_on_a_map_starts_at_most_limit_items_per_window(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name, input=int)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers, result=True, rate=cyclone.Rate(3, timedelta(seconds=1)))
    def double(ctx: cyclone.StepContext, item: int) -> int:
        return 2 * item

    run = wf.submit(engine, 8)
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    assert run.result(timeout=60) == [2 * i for i in range(8)]
    windows = starts_per_second(
        engine, jobs.c.workflow == name, jobs.c.limit_name == f"step:{name}.double"
    )
    assert all(n <= 3 for _, n in windows), windows
    assert len(windows) >= 3, windows


def test_a_maps_concurrency_and_rate_are_both_kept_on_every_item(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name)

    @wf.step()
    def words(ctx: cyclone.StepContext, value: dict[str, Any]) -> list[str]:
        return list(value["words"])

    @wf.map(
        over=words,
        result=True,
        concurrency=cyclone.Concurrency(2, key=lambda v: v["tenant"]),
        rate=cyclone.Rate(100, timedelta(seconds=1), key=lambda v: v["region"]),
    )
    def upper(ctx: cyclone.StepContext, word: str) -> str:
        return word.upper()

    run = wf.submit(engine, {"tenant": "t1", "region": "eu", "words": ["a", "b", "c"]})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    assert run.result(timeout=30) == ["A", "B", "C"]
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT DISTINCT limit_name, limit_key, rate_name, rate_key, item IS NULL "
                "FROM cyclone_jobs WHERE workflow = :w AND kind = 'upper' ORDER BY 5"
            ),
            {"w": name},
        ).all()
    assert rows == [
        (f"step:{name}.upper", "t1", f"step:{name}.upper.rate", "eu", False),  # the items
        (None, None, None, None, True),  # the map node's own job, which runs none of upper
    ]


def test_a_child_nodes_running_attempts_never_exceed_its_concurrency(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    child: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(
        f"{name}-child", input=int, output=int
    )

    @child.result()
    def square(ctx: cyclone.StepContext, n: int) -> int:
        return n * n

    parent: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(name, input=int, output=int)

    @parent.child(child, concurrency=cyclone.Concurrency(1))
    def start(ctx: cyclone.StepContext, n: int) -> int:
        time.sleep(0.02)  # some work, so that attempts would overlap without the limit
        return n

    @parent.result(after=[start])
    def done(ctx: cyclone.StepContext, n: int) -> int:
        return int(ctx.output(start))

    runs = [parent.submit(engine, n) for n in range(6)]
    serving(cyclone.Worker(engine, workflows=[parent, child], concurrency=4, poll_interval=0.2))
    serving(cyclone.Worker(engine, workflows=[parent, child], concurrency=4, poll_interval=0.2))
    most = sample(engine, RUNNING, f"step:{name}.start", all_ended(runs))
    assert most == Counter({"": 1})
    assert [run.result(timeout=10) for run in runs] == [n * n for n in range(6)]


def test_a_parked_child_node_holds_no_slot_of_its_limit(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    child: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-child", input=int)

    @child.wait("go")
    def hold(ctx: cyclone.StepContext, payload: int) -> int:
        return payload

    parent: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @parent.child(child, concurrency=cyclone.Concurrency(1))
    def start(ctx: cyclone.StepContext, n: int) -> int:
        return n

    first, second = parent.submit(engine, 1), parent.submit(engine, 2)
    serving(cyclone.Worker(engine, workflows=[parent, child], concurrency=2, poll_interval=0.2))
    # The first node parked for its child (which waits for a signal): the second node
    # takes the one slot and submits its child too.
    wait_until(lambda: len(first.children()) == 1 and len(second.children()) == 1, timeout=30)
    with engine.connect() as conn:
        states = conn.execute(
            sa.text(
                "SELECT state, limit_name FROM cyclone_jobs WHERE workflow = :w AND kind = 'start'"
            ),
            {"w": name},
        ).all()
    assert sorted(states) == [("blocked", f"step:{name}.start")] * 2
    for run in (first, second):
        (kid,) = run.children()
        child.signal(engine, kid.key, "go", 0)
    wait_until(lambda: first.status().state == second.status().state == "completed", timeout=30)


@pytest.mark.parametrize("parents_worker", ["serving", "stopping"])
def test_a_limited_child_node_parking_again_wakes_the_worker_waiting_for_its_slot(
    engine: sa.Engine, name: str, serving: Any, parents_worker: str
) -> None:
    # A node that finds its child already submitted (woken after the child ended, the
    # child retried before the node ran) parks again without submitting anything: no
    # statement rang for the slot it freed, and a job of another kind under the same
    # limit's name, served by another worker, waited for that worker's poll. Found by a
    # review: when the parent's worker was asked to stop while the node ran, it had no
    # outcome to record and no room to claim, and made no statement that rang either.
    limit = cyclone.Concurrency(1, name=f"{name}-slot")
    child: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-child", input=int)

    @child.wait("go")
    def hold(ctx: cyclone.StepContext, payload: int) -> int:
        return payload

    parent: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @parent.child(child, concurrency=limit)
    def start(ctx: cyclone.StepContext, n: int) -> int:
        return n

    other = cyclone.step(f"{name}.other", concurrency=limit)(lambda ctx, args: args)
    run = parent.submit(engine, 1)
    parents = cyclone.Worker(engine, workflows=[parent, child], poll_interval=0.2, sweep=False)
    background = serving(parents)
    waiting = cyclone.Worker(engine, steps=[other], poll_interval=3600, sweep=False)
    serving(waiting)
    node = (jobs.c.run_id == run.id) & (jobs.c.kind == "start")
    with engine.connect() as conn:
        wait_until(
            lambda: (
                len(run.children()) == 1
                and conn.execute(sa.select(jobs.c.state).where(node)).scalar() == "blocked"
            ),
            timeout=30,
        )
        conn.rollback()
    (kid,) = run.children()
    with engine.connect() as locking:
        # The child run's row locked: the node's next attempt holds its slot until the
        # test lets it go on (it records itself as the child's parent).
        locking.execute(sa.select(runs.c.id).where(runs.c.id == kid.id).with_for_update())
        with engine.begin() as conn:  # as the node is woken when its child ended
            conn.execute(
                sa.update(jobs).where(node).values(state="available", scheduled_at=sa.func.now())
            )
        with engine.connect() as conn:
            wait_until(
                lambda: conn.execute(sa.select(jobs.c.state).where(node)).scalar() == "running",
                timeout=30,
            )
        job = other.enqueue(engine, 1)
        wait_until(lambda: asleep(engine, waiting), timeout=30)
        assert job.status().state == "available"
        if parents_worker == "stopping":
            parents.stop()  # no grace: it waits for the node, which parks
        locking.rollback()
    if parents_worker == "stopping":
        background.join(30)
    wait_until(
        lambda: job.status().state == "completed",
        timeout=30,
        message=lambda: (
            f"the job under the freed slot is {job.status().state}, "
            f"its worker asleep: {asleep(engine, waiting)}"
        ),
    )
    with engine.connect() as conn:
        assert conn.execute(sa.select(jobs.c.state).where(node)).scalar() == "blocked"
    if parents_worker == "serving":
        child.signal(engine, kid.key, "go", 0)
        wait_until(lambda: run.status().state == "completed", timeout=30)


def test_map_and_child_limits_refuse_bad_values_at_definition(name: str) -> None:
    other: cyclone.Workflow[Any] = cyclone.Workflow(f"{name}-other")
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def source(ctx: cyclone.StepContext, value: Any) -> list[int]:
        return [1]

    makers = (
        lambda **kw: wf.map(over=source, **kw),
        lambda **kw: wf.child(other, **kw),
    )
    for make in makers:
        for bad in ("cancel_newest", "cancel_in_progress"):
            with pytest.raises(cyclone.DefinitionError, match="on_limit"):
                make(concurrency=cyclone.Concurrency(1, on_limit=bad))
        with pytest.raises(cyclone.DefinitionError, match="concurrency= takes"):
            make(concurrency=3)
        with pytest.raises(cyclone.DefinitionError, match="rate= takes"):
            make(rate=cyclone.Concurrency(1))
        with pytest.raises(cyclone.DefinitionError, match="different names"):
            make(
                concurrency=cyclone.Concurrency(1, name="same"),
                rate=cyclone.Rate(1, timedelta(seconds=1), name="same"),
            )
    assert list(wf.steps) == ["source"]


def test_a_map_limits_key_that_raises_refuses_the_submit_writing_nothing(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def source(ctx: cyclone.StepContext, value: Any) -> list[int]:
        return [1]

    @wf.map(over=source, concurrency=cyclone.Concurrency(1, key=lambda v: v["missing"]))
    def each(ctx: cyclone.StepContext, item: int) -> None: ...

    with pytest.raises(cyclone.InputError, match="key of limit"):
        wf.submit(engine, {"k": "a"})
    with engine.connect() as conn:
        count = conn.execute(
            sa.text("SELECT count(*) FROM cyclone_runs WHERE workflow = :w"), {"w": name}
        ).scalar_one()
    assert count == 0


def test_a_maps_own_expand_and_collect_wait_for_no_window_of_its_items_rate(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name, input=int)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    # Two starts an hour: both items start in this window, and the node's expansion and
    # collection, which run none of ``plus``, take none of them.
    @wf.map(over=numbers, result=True, rate=cyclone.Rate(2, timedelta(hours=1)))
    def plus(ctx: cyclone.StepContext, item: int) -> int:
        return item + 1

    run = wf.submit(engine, 2)
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=0.2))
    assert run.result(timeout=30) == [1, 2]


def test_a_limited_maps_retried_forked_and_retried_all_items_keep_their_limits(
    engine: sa.Engine, name: str
) -> None:
    failing = {1}
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, value: dict[str, Any]) -> list[int]:
        return list(range(value["n"]))

    @wf.map(
        over=numbers,
        result=True,
        max_attempts=1,
        concurrency=cyclone.Concurrency(1, key=lambda v: v["k"]),
    )
    def check(ctx: cyclone.StepContext, item: int) -> int:
        if item in failing:
            raise RuntimeError(f"item {item} failed")
        return item

    run = wf.submit(engine, {"k": "a", "n": 3})
    with cyclone.Worker(engine, workflows=[wf]) as worker:
        worker.drain()
    assert run.status().state == "failed"
    failing.clear()
    run.retry()  # the failed item runs again, with its limit
    with cyclone.Worker(engine, workflows=[wf]) as worker:
        worker.drain()
    assert run.result(timeout=10) == [0, 1, 2]
    forked, _ = run.fork("again", rerun=["check"])  # expands anew, with the run's keys
    with cyclone.Worker(engine, workflows=[wf]) as worker:
        worker.drain()
    assert forked.result(timeout=10) == [0, 1, 2]
    run.retry_all()  # every item anew, over the list ``numbers`` returns this time
    with cyclone.Worker(engine, workflows=[wf]) as worker:
        worker.drain()
    assert run.result(timeout=10) == [0, 1, 2]
    with engine.connect() as conn:
        kept = conn.execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE limit_key = 'a'), count(*) FROM cyclone_jobs "
                "WHERE workflow = :w AND kind = 'check' AND item IS NOT NULL"
            ),
            {"w": name},
        ).one()
    assert tuple(kept) == (6, 6)
