"""Workers run DAGs: order, parallelism, the step context, and which jobs a worker claims."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

import cyclone
from cyclone.schema import jobs, runs
from tests.conftest import wait_until
from tests.support.counting import Recorder
from tests.support.workers import Background, job_rows, start_runs


class Order(msgspec.Struct):
    id: int
    amount: int


class Reservation(msgspec.Struct):
    sku: str
    qty: int


class Trace:
    """Records when each step starts and ends, and how many run at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.running = 0
        self.max_running = 0

    def enter(self, step: str) -> None:
        with self._lock:
            assert step not in self.started, f"{step} ran twice"
            self.started[step] = time.monotonic()
            self.running += 1
            self.max_running = max(self.max_running, self.running)

    def leave(self, step: str) -> None:
        with self._lock:
            self.running -= 1
            self.ended[step] = time.monotonic()

    def assert_order(self, wf: cyclone.Workflow[Any]) -> None:
        assert set(self.ended) == set(wf.steps)
        for step in wf.steps.values():
            for dep in step.after:
                assert self.ended[dep] <= self.started[step.name], (
                    f"{step.name} started before {dep} ended"
                )


def traced(wf: cyclone.Workflow[Any], trace: Trace, name: str, after: list[str]) -> None:
    @wf.step(name, after=after)
    def fn(ctx: cyclone.StepContext, value: Any) -> str:
        trace.enter(ctx.step)
        time.sleep(0.01)  # the step's work: long enough for steps running at once to overlap
        trace.leave(ctx.step)
        return ctx.step


def test_drain_runs_steps_unblocked_meanwhile_and_returns_the_count(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step()
    def a(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("a")

    @wf.step(after=[a])
    def b(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("b")

    @wf.step(after=[b])
    def c(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("c")

    runs = [wf.submit(engine, i) for i in range(3)]

    assert cyclone.Worker(engine, workflows=[wf]).drain() == 9

    assert sorted(calls) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert all(run.status().state == cyclone.RunState.COMPLETED for run in runs)
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 0


def test_a_chain_runs_in_dependency_order(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    trace = Trace()
    for step, after in [("a", []), ("b", ["a"]), ("c", ["b"]), ("d", ["c"])]:
        traced(wf, trace, step, after)
    run = wf.submit(engine, None)

    cyclone.Worker(engine, workflows=[wf], concurrency=4).drain()

    trace.assert_order(wf)
    assert sorted(trace.started, key=trace.started.__getitem__) == ["a", "b", "c", "d"]
    assert run.status().state == cyclone.RunState.COMPLETED


def test_a_diamond_joins_after_both_branches(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    trace = Trace()
    for step, after in [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"])]:
        traced(wf, trace, step, after)
    run = wf.submit(engine, None)

    assert cyclone.Worker(engine, workflows=[wf], concurrency=4).drain() == 4

    trace.assert_order(wf)
    assert run.status().state == cyclone.RunState.COMPLETED


def test_a_wide_dag_of_eight_branches_joins_once(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    trace = Trace()
    branches = [f"branch{i}" for i in range(8)]
    traced(wf, trace, "root", [])
    for branch in branches:
        traced(wf, trace, branch, ["root"])
    traced(wf, trace, "join", branches)
    traced(wf, trace, "tail", ["join"])
    run = wf.submit(engine, None)

    assert cyclone.Worker(engine, workflows=[wf], concurrency=8).drain() == 11

    trace.assert_order(wf)
    assert run.status().state == cyclone.RunState.COMPLETED
    assert {row.state for row in job_rows(engine, run.id).values()} == {"completed"}


def test_independent_steps_run_in_parallel_up_to_concurrency(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    barrier = threading.Barrier(parties=4, timeout=10)

    for i in range(4):

        @wf.step(f"parallel{i}", max_attempts=1)
        def parallel(ctx: cyclone.StepContext, value: Any) -> None:
            barrier.wait()  # passes only when all four run at once

    run = wf.submit(engine, None)

    assert cyclone.Worker(engine, workflows=[wf], concurrency=4).drain() == 4

    assert run.status().state == cyclone.RunState.COMPLETED
    assert not barrier.broken


def test_never_more_steps_run_at_once_than_concurrency(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    trace = Trace()
    barrier = threading.Barrier(parties=3, timeout=10)

    for i in range(9):

        @wf.step(f"s{i}", max_attempts=1)
        def step(ctx: cyclone.StepContext, value: Any) -> None:
            trace.enter(ctx.step)
            barrier.wait()  # groups of three: the worker keeps all three slots busy
            trace.leave(ctx.step)

    run = wf.submit(engine, None)

    assert cyclone.Worker(engine, workflows=[wf], concurrency=3).drain() == 9

    assert run.status().state == cyclone.RunState.COMPLETED
    assert trace.max_running == 3


def test_ctx_output_decodes_upstream_output_to_its_return_type(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name, input=Order)
    seen: dict[str, Any] = {}

    @wf.step()
    def reserve(ctx: cyclone.StepContext, order: Order) -> Reservation:
        return Reservation(sku=f"sku-{order.id}", qty=order.amount)

    @wf.step(after=[reserve])
    def charge(ctx: cyclone.StepContext, order: Order) -> int:
        seen["reservation"] = ctx.output(reserve)
        seen["run_id"] = ctx.run_id
        seen["attempt"] = ctx.attempt
        seen["input"] = ctx.input
        seen["order"] = order
        return order.amount

    run = wf.submit(engine, Order(id=7, amount=3))
    cyclone.Worker(engine, workflows=[wf]).drain()

    assert seen["reservation"] == Reservation(sku="sku-7", qty=3)
    assert type(seen["reservation"]) is Reservation
    assert seen["run_id"] == run.id
    assert seen["attempt"] == 1
    assert seen["input"] == Order(id=7, amount=3)
    assert seen["order"] == Order(id=7, amount=3)


def test_ctx_attempt_counts_the_attempts_of_a_step(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    attempts: list[int] = []

    @wf.step(max_attempts=3)
    def flaky(ctx: cyclone.StepContext, value: Any) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise RuntimeError("not yet")

    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf], backoff=lambda n: 0.0).drain()

    assert attempts == [1, 2, 3]
    assert run.status().state == cyclone.RunState.COMPLETED


def test_ctx_output_of_a_step_not_upstream_raises_key_error(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    caught: list[BaseException] = []

    @wf.step()
    def root(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    @wf.step(after=[root])
    def middle(ctx: cyclone.StepContext, value: Any) -> int:
        return 2

    @wf.step(after=[root])
    def sibling(ctx: cyclone.StepContext, value: Any) -> int:
        return 3

    @wf.step(after=[middle, sibling])
    def leaf(ctx: cyclone.StepContext, value: Any) -> int:
        with pytest.raises(KeyError) as excinfo:
            ctx.output(root)  # upstream of upstream, but not a step leaf comes after
        caught.append(excinfo.value)
        return ctx.output(middle) + ctx.output(sibling)

    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf]).drain()

    assert len(caught) == 1
    assert run.status().state == cyclone.RunState.COMPLETED
    assert job_rows(engine, run.id)["leaf"].output == 5


def test_a_worker_claims_only_the_workflows_it_was_given(engine: sa.Engine, name: str) -> None:
    called: list[str] = []
    wf_a = cyclone.Workflow(f"{name}_a")
    wf_b = cyclone.Workflow(f"{name}_b")

    @wf_a.step()
    def step_a(ctx: cyclone.StepContext, value: Any) -> None:
        called.append("a")

    @wf_b.step()
    def step_b(ctx: cyclone.StepContext, value: Any) -> None:
        called.append("b")

    run_a = wf_a.submit(engine, None)
    run_b = wf_b.submit(engine, None)

    assert cyclone.Worker(engine, workflows=[wf_a]).drain() == 1

    assert called == ["a"]
    assert run_a.status().state == cyclone.RunState.COMPLETED
    assert run_b.status().state == cyclone.RunState.RUNNING
    untouched = job_rows(engine, run_b.id)["step_b"]
    assert (untouched.state, untouched.attempt, untouched.worker_id) == ("available", 0, None)

    assert cyclone.Worker(engine, workflows=[wf_b]).drain() == 1

    assert called == ["a", "b"]
    assert run_b.status().state == cyclone.RunState.COMPLETED


def test_a_worker_claims_only_the_step_kinds_it_was_given(engine: sa.Engine, name: str) -> None:
    called: list[str] = []

    @cyclone.step(f"{name}.known")
    def known(ctx: cyclone.StepContext, value: int) -> None:
        called.append("known")

    @cyclone.step(f"{name}.other")
    def other(ctx: cyclone.StepContext, value: int) -> None:
        called.append("other")

    known.enqueue(engine, 1)
    job = other.enqueue(engine, 2)

    assert cyclone.Worker(engine, steps=[known]).drain() == 1

    assert called == ["known"]
    assert job.status().state == cyclone.JobState.AVAILABLE


def test_a_job_whose_step_was_removed_fails_with_step_not_defined(
    engine: sa.Engine, name: str
) -> None:
    old = cyclone.Workflow(name)

    @old.step()
    def kept(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    @old.step(after=[kept])
    def removed(ctx: cyclone.StepContext, value: Any) -> int:
        return 2

    run = old.submit(engine, None)

    new = cyclone.Workflow(name)  # the same name, redeployed without ``removed``

    @new.step("kept")
    def kept_again(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    worker = cyclone.Worker(engine, workflows=[new], backoff=lambda n: 0.0)
    assert worker.drain() == 2

    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.failed_step == "removed"
    assert status.error is not None
    assert status.error["type"] == "StepNotDefined"
    rows = job_rows(engine, run.id)
    assert rows["removed"].attempt == 1  # no retry can mend it
    assert [e["type"] for e in rows["removed"].errors] == ["StepNotDefined"]

    # The worker is still usable, even by another run of the old graph.
    again = old.submit(engine, None)
    assert worker.drain() == 2
    assert again.status().state == cyclone.RunState.FAILED


def test_joins_run_once_when_two_workers_finish_their_branches_at_once(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    lock = threading.Lock()
    executions: Counter[tuple[str, str]] = Counter()

    def record(ctx: cyclone.StepContext) -> None:
        with lock:
            executions[(str(ctx.run_id), ctx.step)] += 1

    @wf.step()
    def top(ctx: cyclone.StepContext, value: Any) -> None:
        record(ctx)

    @wf.step(after=[top])
    def left(ctx: cyclone.StepContext, value: Any) -> None:
        record(ctx)

    @wf.step(after=[top])
    def right(ctx: cyclone.StepContext, value: Any) -> None:
        record(ctx)

    @wf.step(after=[left, right])
    def join(ctx: cyclone.StepContext, value: Any) -> None:
        record(ctx)

    runs = [wf.submit(engine, i) for i in range(30)]
    workers = [cyclone.Worker(engine, workflows=[wf], concurrency=4) for _ in range(2)]
    start = threading.Barrier(parties=2, timeout=10)

    def drain(worker: cyclone.Worker) -> int:
        start.wait()
        return worker.drain()

    draining = [Background(lambda w=w: drain(w)) for w in workers]
    assert sum(d.join(30) for d in draining) == 30 * 4

    assert executions == {(str(run.id), step): 1 for run in runs for step in wf.steps}
    assert all(run.status().state == cyclone.RunState.COMPLETED for run in runs)


@pytest.mark.parametrize("odd", ["%", "%(x)s", "'", "\\", '"'])
def test_names_with_quotes_percent_and_backslash_are_stored_and_run_as_given(
    engine: sa.Engine, name: str, odd: str
) -> None:
    wf = cyclone.Workflow(f"{name}{odd}w", input=int)

    @wf.step(name=f"s{odd}1")
    def first(ctx: cyclone.StepContext, value: int) -> int:
        return value

    run, created = wf.submit_once(engine, f"k{odd}", 1)
    again, created_again = wf.submit_once(engine, f"k{odd}", 1)
    assert (created, created_again, again.id) == (True, False, run.id)
    assert run.status().workflow == f"{name}{odd}w"
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 1
    assert run.status().state == cyclone.RunState.COMPLETED


class Claims(Recorder):
    """Counts the claim statements one thread sends."""

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.count = 0

    def record(self, thread: str, statement: str) -> None:
        if thread == self.thread and "SKIP LOCKED" in statement:
            self.count += 1


def test_a_join_becomes_available_only_when_its_last_upstream_finishes_seconds_later(
    engine: sa.Engine, name: str
) -> None:
    # The branches' outcomes land in separate statements, claims apart: the first alone
    # must leave the join blocked.
    wf = cyclone.Workflow(name)
    release = threading.Event()
    calls: list[str] = []
    seen: dict[str, Any] = {}

    @wf.step()
    def fast(ctx: cyclone.StepContext, value: Any) -> str:
        calls.append("fast")
        return "fast"

    @wf.step()
    def slow(ctx: cyclone.StepContext, value: Any) -> str:
        assert release.wait(30)
        calls.append("slow")
        return "slow"

    @wf.step(after=[fast, slow])
    def join(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("join")
        seen["outputs"] = (ctx.output(fast), ctx.output(slow))

    run = wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=0.05, sweep=False)
    claims = Claims(f"serving-{name}")
    serving = Background(worker.run, name=claims.thread)
    try:
        wait_until(lambda: job_rows(engine, run.id)["fast"].state == "completed", timeout=10)
        assert job_rows(engine, run.id)["slow"].state == "running"
        with claims:  # the worker keeps claiming meanwhile (every poll_interval): ten times
            wait_until(lambda: claims.count >= 10, timeout=10)
        assert job_rows(engine, run.id)["join"].state == "blocked"
        assert calls == ["fast"]
        release.set()
        assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    finally:
        release.set()
        worker.stop()
        serving.join(10)
    assert calls == ["fast", "slow", "join"]
    assert seen["outputs"] == ("fast", "slow")


def test_a_claim_skips_a_run_to_start_that_another_transaction_has_locked(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    calls: list[int] = []

    @wf.step()
    def only(ctx: cyclone.StepContext, value: int) -> None:
        calls.append(value)

    locked = wf.submit(engine, 1)
    wf.submit(engine, 2)
    with engine.connect() as other:
        other.execute(sa.select(runs.c.id).where(runs.c.id == locked.id).with_for_update()).one()
        draining = Background(cyclone.Worker(engine, workflows=[wf], sweep=False).drain)
        try:
            assert draining.join(10) == 1  # did not wait for the lock
        finally:
            other.rollback()
    assert calls == [2]
    assert job_rows(engine, locked.id)["only"].state == "available"
    assert cyclone.Worker(engine, workflows=[wf], sweep=False).drain() == 1
    assert calls == [2, 1]


def test_a_claim_skips_a_job_another_transaction_has_locked(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    calls: list[int] = []

    @wf.step()
    def only(ctx: cyclone.StepContext, value: int) -> None:
        calls.append(value)

    locked = wf.submit(engine, 1)
    free = wf.submit(engine, 2)
    start_runs(engine, wf)
    with engine.connect() as other:
        other.execute(
            sa.select(jobs.c.id).where(jobs.c.run_id == locked.id).with_for_update()
        ).one()
        draining = Background(cyclone.Worker(engine, workflows=[wf], sweep=False).drain)
        try:
            assert draining.join(10) == 1  # did not wait for the lock
        finally:
            other.rollback()
    assert calls == [2]
    assert job_rows(engine, locked.id)["only"].state == "available"
    assert free.status().state == cyclone.RunState.COMPLETED

    assert cyclone.Worker(engine, workflows=[wf], sweep=False).drain() == 1
    assert calls == [2, 1]
