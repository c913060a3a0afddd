"""A step made ready by a success runs on the worker that records it, in the same statement.

The record-and-claim statement that completes a step's last upstream step takes the
step from blocked to running for its worker (``job.continue``), when the worker has a
slot for it and could claim it: not limited, of a queue it serves and not paused, due.
Otherwise the step is made available as before, for any worker's next claim.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

import cyclone
from cyclone._store import claim as _claim
from cyclone._store import completion as _completion
from cyclone._store import executor as _executor
from cyclone._store import queues as _queues
from cyclone.schema import jobs
from tests.support.workers import start_runs


def _fan(name: str, **c_options: Any) -> cyclone.Workflow[int]:
    """``a`` then ``b`` and ``c`` (``c`` with ``c_options``), then ``d`` after both."""
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def a(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @wf.step(after=[a], priority=1)
    def b(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @wf.step(after=[a], **c_options)
    def c(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @wf.step(after=[b, c])
    def d(ctx: cyclone.StepContext, n: int) -> int:
        return n

    return wf


def _states(engine: sa.Engine, run_id: Any) -> dict[str, tuple[str, str | None, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(jobs.c.kind, jobs.c.state, jobs.c.worker_id, jobs.c.attempt).where(
                jobs.c.run_id == run_id
            )
        ).all()
    return {kind: (state, worker, attempt) for kind, state, worker, attempt in rows}


class _Claims:
    """One worker's record-and-claim statements on its own held connection."""

    def __init__(self, engine: sa.Engine, wf: cyclone.Workflow[Any], me: str = "w1") -> None:
        self.held = _executor.Held(engine)
        self.scope = _claim.Scope(queues=None, workflows=(wf.name,), kinds=())
        self.me = me

    def __call__(
        self, limit: int, *done: _claim.Claimed, output: str = "7", scope: Any = None
    ) -> list[_claim.Claimed]:
        successes = [_completion.Success(job.id, job.lease, output) for job in done]
        recorded, got = _claim.record_and_claim(
            self.held,
            worker_id=self.me,
            successes=successes,
            scope=scope or self.scope,
            limit=limit,
        )
        assert recorded == {job.id for job in done}
        return got

    def close(self) -> None:
        self.held.close()

    def __enter__(self) -> _Claims:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def test_the_steps_a_success_makes_ready_run_on_its_worker_in_priority_order_up_to_its_room(
    engine: sa.Engine, name: str
) -> None:
    wf = _fan(name)
    run = wf.submit(engine, 5)
    with _Claims(engine, wf) as claims:
        (a,) = claims(4)
        assert a.kind == "a"
        later = wf.submit(engine, 6)
        # Room for one of the two dependents: c (priority 0) before b (priority 1). The
        # run submitted since is not started: no slot is left for its root.
        (c,) = claims(1, a, output='{"x": 1}')
        assert _states(engine, later.id) == {}
        later.cancel()
        assert (c.kind, c.attempt, c.lease) == ("c", 1, 1)
        # The statement's snapshot holds a running: its output comes from the record.
        assert {k: bytes(v) for k, v in c.upstream.items()} == {"a": b'{"x": 1}'}
        assert c.input == "5"
        assert c.key is None
        states = _states(engine, run.id)
        assert states["b"] == ("available", None, 0)
        assert states["c"] == ("running", "w1", 1)
        assert states["d"] == ("blocked", None, 0)
        # b is claimed as any available step; d waits for both.
        (b,) = claims(4, c)
        assert b.kind == "b"
        assert _states(engine, run.id)["d"] == ("blocked", None, 0)
        (d,) = claims(4, b)
        assert (d.kind, d.attempt) == ("d", 1)
        assert set(d.upstream) == {"b", "c"}
        assert claims(4, d) == []
        assert run.wait(timeout=5).state == "completed"


def test_a_success_recorded_without_room_makes_its_dependents_available(
    engine: sa.Engine, name: str
) -> None:
    wf = _fan(name)
    run = wf.submit(engine, 5)
    with _Claims(engine, wf) as claims:
        (a,) = claims(1)
        assert claims(0, a) == []
        states = _states(engine, run.id)
        assert states["b"][0] == states["c"][0] == "available"
        got = claims(4)
        assert sorted(job.kind for job in got) == ["b", "c"]
        (d,) = claims(4, *got)
        assert claims(4, d) == []


def test_a_step_its_worker_could_not_claim_is_made_available_not_continued(
    engine: sa.Engine, name: str
) -> None:
    """A limited step, a step of a queue the recording claim does not serve, and a step
    of a paused queue are left to the claims that take them."""
    limited = _fan(f"{name}-limited", concurrency=cyclone.Concurrency(1))
    other_queue = _fan(f"{name}-queue", queue="elsewhere")
    paused = _fan(f"{name}-paused", queue=f"{name}-paused")
    _queues.pause(engine, f"{name}-paused")
    try:
        for wf, scope in [
            (limited, None),
            (
                other_queue,
                _claim.Scope(queues=("default",), workflows=(other_queue.name,), kinds=()),
            ),
            (paused, None),
        ]:
            run = wf.submit(engine, 1)
            with _Claims(engine, wf) as claims:
                (a,) = claims(4, scope=scope)
                (b,) = claims(4, a, scope=scope)
                assert b.kind == "b", wf.name
                assert _states(engine, run.id)["c"] == ("available", None, 0), wf.name
                assert claims(0, b, scope=scope) == []
    finally:
        _queues.resume(engine, f"{name}-paused")


def test_a_join_recorded_concurrently_runs_once_with_both_upstream_outputs(
    engine: sa.Engine, name: str
) -> None:
    """Two workers record the two upstream steps of ``d`` at once. The statement that
    records last waited for the run's lock, and its snapshot holds the other upstream
    step running: it makes ``d`` available rather than continue it without that output.
    Either way ``d`` runs once, given both outputs."""
    wf = _fan(name)
    for _ in range(20):
        run = wf.submit(engine, 1)
        barrier = threading.Barrier(2)
        got: dict[str, list[_claim.Claimed]] = {}

        def record(
            claims: _Claims,
            job: _claim.Claimed,
            output: str,
            barrier: threading.Barrier = barrier,
            got: dict[str, list[_claim.Claimed]] = got,
        ) -> None:
            barrier.wait()
            got[claims.me] = claims(1, job, output=output)

        workers = {"w1": _Claims(engine, wf, "w1"), "w2": _Claims(engine, wf, "w2")}
        try:
            (a,) = workers["w1"](1)
            (c,) = workers["w1"](1, a)
            (b,) = workers["w2"](1)
            assert b.kind == "b"
            threads = [
                threading.Thread(target=record, args=(workers["w1"], c, "3")),
                threading.Thread(target=record, args=(workers["w2"], b, "2")),
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
            assert set(got) == {"w1", "w2"}
            continued = [(me, job) for me, claimed in got.items() for job in claimed]
            assert len(continued) <= 1, continued
            if continued:
                me, d = continued[0]
                assert _states(engine, run.id)["d"] == ("running", me, 1)
            else:
                me = "w1"
                assert _states(engine, run.id)["d"] == ("available", None, 0)
                (d,) = workers[me](1)
            assert (d.kind, d.attempt) == ("d", 1)
            assert {k: bytes(v) for k, v in d.upstream.items()} == {"b": b"2", "c": b"3"}
            assert workers[me](0, d) == []
            assert run.wait(timeout=5).state == "completed"
        finally:
            for claims in workers.values():
                claims.close()


def test_the_steps_made_ready_take_the_slots_in_priority_order_with_the_jobs_picked(
    engine: sa.Engine, name: str
) -> None:
    """A step made ready comes after an available job of a higher priority: ``b``
    (priority 1) is made available while ``c`` and another run's root (priority 0) take
    the two slots, ``c`` first (its run started earlier)."""
    wf = _fan(name)
    first = wf.submit(engine, 1)
    with _Claims(engine, wf) as claims:
        (a,) = claims(1)
        second = wf.submit(engine, 2)
        start_runs(engine, wf)
        assert _states(engine, second.id)["a"] == ("available", None, 0)
        got = claims(2, a)
        assert [(job.run_id, job.kind) for job in got] == [(first.id, "c"), (second.id, "a")]
        assert _states(engine, first.id)["b"] == ("available", None, 0)
        assert got[0].attempt == got[1].attempt == 1
        assert claims(0, *got) == []
    for run in (first, second):
        run.cancel()
