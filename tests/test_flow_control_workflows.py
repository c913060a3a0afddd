"""Workflow limits: ``Workflow(..., concurrency=)`` bounds the runs in progress per key.

A run in progress is admitted and not ended; a held run waits with no steps. The
multi-process test samples the runs in progress per key from the database while
several worker processes serve; the others run a worker in this process.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits_store
from cyclone._store import rescue as _rescue
from cyclone.schema import runs, waiters
from tests.conftest import wait_until
from tests.support.flow_proc import workflow
from tests.support.workers import Background, start_runs, waiting_on_locks
from tests.test_flow_control import (
    a_worker_waits_for_the_slot_of_a_killed_worker,
    asleep,
    lost_twice_before,
    spawn,
    stop,
)

IN_PROGRESS = (
    "SELECT limit_key, count(*) FROM cyclone_runs WHERE workflow = :w AND state = 'running' "
    "AND (start_at IS NULL OR start_at < 'infinity') GROUP BY limit_key"
)


def in_progress(engine: sa.Engine, wf: str) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(dict(conn.execute(sa.text(IN_PROGRESS), {"w": wf}).all()))


def states(engine: sa.Engine, wf: str) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT state, count(*) FROM cyclone_runs WHERE workflow = :w GROUP BY state"),
            {"w": wf},
        )
        return Counter(dict(rows.all()))


def test_the_runs_in_progress_per_key_never_exceed_max_across_worker_processes(
    engine: sa.Engine, name: str
) -> None:
    spec = {"limit": "workflow", "max": 1, "concurrency": 4}
    wf = workflow(name, spec)
    for k in "abc":
        for _ in range(6):
            wf.submit(engine, {"k": k, "ms": 15})
    procs = [spawn(name, spec) for _ in range(3)]
    most: Counter[str] = Counter()
    try:

        def done() -> bool:
            for key, n in in_progress(engine, name).items():
                most[key] = max(most[key], n)
            return states(engine, name) == Counter({"completed": 18})

        wait_until(done, timeout=90, interval=0.005)
    finally:
        stop(procs)
    assert set(most) == {"a", "b", "c"}
    assert max(most.values()) == 1, most


def started(engine: sa.Engine, run: Any) -> bool:
    """Whether a step of ``run`` is running."""
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM cyclone_jobs WHERE run_id = :r AND state = 'running'"
                ),
                {"r": run.id},
            ).scalar_one()
        )


def jobs_of(engine: sa.Engine, run: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM cyclone_jobs WHERE run_id = :r"), {"r": run.id}
            ).scalar_one()
        )


def blocking_workflow(name: str, **limit: Any) -> tuple[cyclone.Workflow[Any], threading.Event]:
    """A limited workflow whose one step blocks until the event is set."""
    release = threading.Event()
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        name, concurrency=cyclone.Concurrency(1, key=lambda v: v["k"], **limit)
    )

    @wf.step()
    def only(ctx: cyclone.StepContext, value: dict[str, Any]) -> str:
        assert release.wait(30)
        return str(value["n"])

    return wf, release


def test_a_held_run_waits_without_steps_and_starts_when_its_keys_run_ends(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_workflow(name)
    first = wf.submit(engine, {"k": "a", "n": 1})
    second = wf.submit(engine, {"k": "a", "n": 2})
    other = wf.submit(engine, {"k": "b", "n": 3})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=30))
    wait_until(lambda: in_progress(engine, name) == Counter({"a": 1, "b": 1}))
    assert second.status().state == "running"
    assert jobs_of(engine, second) == 0  # held: no steps yet
    (limit,) = [s for s in cyclone.Client(engine).list_limits() if s.name == f"workflow:{name}"]
    assert limit.counts == "runs"
    assert limit.max == 1
    assert dict(limit.keys)["a"] == (1, 1)
    release.set()
    for run in (first, second, other):
        wait_until(lambda run=run: run.status().state == "completed", timeout=20)


def test_submit_once_duplicates_take_no_second_slot(engine: sa.Engine, name: str) -> None:
    wf, _ = blocking_workflow(name)
    one, created = wf.submit_once(engine, "order:1", {"k": "a", "n": 1})
    two, again = wf.submit_once(engine, "order:1", {"k": "a", "n": 1})
    assert created
    assert not again
    assert one.id == two.id
    with engine.connect() as conn:
        held = conn.execute(
            sa.text("SELECT count(*) FROM cyclone_runs WHERE workflow = :w"), {"w": name}
        ).scalar_one()
    assert held == 1


def test_cancel_newest_cancels_the_new_run_naming_the_limit(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_workflow(name, on_limit="cancel_newest")
    first = wf.submit(engine, {"k": "a", "n": 1})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=30))
    wait_until(lambda: started(engine, first))
    newest = wf.submit(engine, {"k": "a", "n": 2})
    wait_until(lambda: newest.status().state == "cancelled")
    error = newest.status().error
    assert error is not None
    assert f"workflow:{name}" in error["message"]
    assert "cancel_newest" in error["message"]
    release.set()
    wait_until(lambda: first.status().state == "completed", timeout=20)


def test_cancel_in_progress_cancels_the_oldest_run_and_admits_the_new_one(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_workflow(name, on_limit="cancel_in_progress")
    oldest = wf.submit(engine, {"k": "a", "n": 1})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=30))
    wait_until(lambda: started(engine, oldest))
    new = wf.submit(engine, {"k": "a", "n": 2})
    wait_until(lambda: oldest.status().state == "cancelled")
    error = oldest.status().error
    assert error is not None
    assert "cancel_in_progress" in error["message"]
    release.set()
    wait_until(lambda: new.status().state == "completed", timeout=20)


def completed_run(engine: sa.Engine, wf: cyclone.Workflow[Any], release: threading.Event) -> Any:
    """A run of key ``a`` of ``blocking_workflow`` that ran to its end; ``release`` is
    cleared again, so the key's next runs block."""
    done = wf.submit(engine, {"k": "a", "n": 1})
    release.set()
    cyclone.Worker(engine, workflows=[wf], concurrency=2).drain()
    assert done.status().state == "completed"
    release.clear()
    return done


def test_retry_of_an_ended_run_respects_the_limit(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_workflow(name)
    done = completed_run(engine, wf, release)
    busy = wf.submit(engine, {"k": "a", "n": 2})
    waiting = wf.submit(engine, {"k": "a", "n": 3})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=30))
    wait_until(lambda: started(engine, busy))
    waiting.cancel()  # held: it never started
    with pytest.raises(cyclone.InvalidStateError, match="at its limit"):
        done.retry_all()  # started before: refused while the key is full
    waiting.retry()  # held again, not in progress
    assert in_progress(engine, name) == Counter({"a": 1})
    release.set()
    wait_until(lambda: waiting.status().state == "completed", timeout=20)
    done.retry_all()
    wait_until(lambda: done.status().state == "completed", timeout=20)


def test_a_fork_counts_as_a_run_in_progress_of_its_sources_key_and_needs_room(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # A fork was inserted started with no limit: it ran beside the key's run in progress,
    # and later runs of the key were admitted beside it.
    wf, release = blocking_workflow(name)
    done = completed_run(engine, wf, release)
    busy = wf.submit(engine, {"k": "a", "n": 2})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=30))
    wait_until(lambda: started(engine, busy))
    with pytest.raises(cyclone.InvalidStateError, match=r"at its limit .* fork once one ends"):
        done.fork("again", rerun=["only"])
    assert states(engine, name) == Counter({"completed": 1, "running": 1})  # nothing written
    # A fork with nothing to run is born completed: it takes no slot and needs none.
    kept, created = done.fork("kept")
    assert created
    assert kept.status().state == "completed"
    release.set()
    wait_until(lambda: busy.status().state == "completed", timeout=20)
    release.clear()
    fork, created = done.fork("again", rerun=["only"])
    assert created
    wait_until(lambda: started(engine, fork))
    assert in_progress(engine, name) == Counter({"a": 1})
    later = wf.submit(engine, {"k": "a", "n": 4})  # held while the fork runs
    assert done.fork("again", rerun=["only"]) == (fork, False)  # the key's fork: no room needed
    assert jobs_of(engine, later) == 0
    release.set()
    wait_until(lambda: later.status().state == "completed", timeout=20)
    ended = fork.status().finished_at
    assert ended is not None
    with engine.connect() as conn:
        began = conn.execute(
            sa.text("SELECT min(attempted_at) FROM cyclone_jobs WHERE run_id = :r"), {"r": later.id}
        ).scalar_one()
    assert began >= ended  # admitted only once the fork ended


def test_a_workflows_limit_key_that_raises_refuses_the_submit(engine: sa.Engine, name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        name, concurrency=cyclone.Concurrency(1, key=lambda v: v["missing"])
    )

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None: ...

    with pytest.raises(cyclone.InputError, match="KeyError"):
        wf.submit(engine, {"k": "a"})
    assert states(engine, name) == Counter()


def test_a_key_with_few_runs_held_is_not_starved_by_a_key_with_many(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        name, concurrency=cyclone.Concurrency(1, key=lambda v: v["k"])
    )

    @wf.step()
    def only(ctx: cyclone.StepContext, value: dict[str, Any]) -> None: ...

    wf.submit_once_many(engine, [(f"big:{i}", {"k": "big", "i": i}) for i in range(40)])
    small = [wf.submit(engine, {"k": "small", "i": i}) for i in range(5)]
    cyclone.Worker(engine, workflows=[wf], concurrency=1).drain()
    with engine.connect() as conn:
        order = (
            conn.execute(
                sa.text(
                    "SELECT r.limit_key FROM cyclone_runs r JOIN cyclone_jobs j ON j.run_id = r.id "
                    "WHERE r.workflow = :w ORDER BY j.attempted_at, j.id"
                ),
                {"w": name},
            )
            .scalars()
            .all()
        )
    assert all(run.status().state == "completed" for run in small)
    assert len(order) == 45
    tenth_big = [i for i, key in enumerate(order) if key == "big"][9]
    assert order.index("small") < tenth_big
    assert max(i for i, key in enumerate(order) if key == "small") < tenth_big, order


def test_list_limits_counts_a_started_run_as_in_progress(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_workflow(name)
    first = wf.submit(engine, {"k": "a", "n": 1})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=30))
    wait_until(lambda: started(engine, first) and jobs_of(engine, first) > 0)
    (limit,) = [s for s in cyclone.Client(engine).list_limits() if s.name == f"workflow:{name}"]
    assert dict(limit.keys)["a"] == (1, 0)
    release.set()
    wait_until(lambda: first.status().state == "completed", timeout=20)


def test_a_named_limit_shared_by_two_workflows_counts_the_runs_of_both(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    shared = f"{name}-shared"
    release = threading.Event()
    made = []
    for wf_name in (name, f"{name}b"):
        wf: cyclone.Workflow[Any] = cyclone.Workflow(
            wf_name, concurrency=cyclone.Concurrency(1, key=lambda v: v["k"], name=shared)
        )

        @wf.step()
        def only(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
            assert release.wait(30)

        made.append(wf)
    one, two = made
    first = one.submit(engine, {"k": "a", "n": 1})
    second = two.submit(engine, {"k": "a", "n": 2})
    serving(cyclone.Worker(engine, workflows=[one, two], concurrency=4, poll_interval=30))
    wait_until(lambda: started(engine, first) or started(engine, second))
    (limit,) = [s for s in cyclone.Client(engine).list_limits() if s.name == shared]
    assert dict(limit.keys)["a"] == (1, 1)
    assert not (started(engine, first) and started(engine, second))
    release.set()
    for run in (first, second):
        wait_until(lambda run=run: run.status().state == "completed", timeout=20)


def test_runs_held_by_a_limit_a_redeploy_dropped_are_admitted_under_the_limit_they_kept(
    engine: sa.Engine, name: str
) -> None:
    # Runs submitted under a workflow's limit wait held until a worker admits them; a
    # deploy that dropped the limit left them held, no worker admitting its name.
    before = workflow(name, {"limit": "workflow", "max": 1})
    held = [before.submit(engine, {"k": "a", "ms": 0}) for _ in range(3)]
    after: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @after.step()
    def first(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        return None

    @after.step(after=[first])
    def second(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        return None

    with cyclone.Worker(engine, workflows=[after], sweep=False) as worker:
        worker.drain()
    assert [run.status().state for run in held] == ["completed"] * 3
    with engine.connect() as conn:
        spans = conn.execute(
            sa.text(
                "SELECT j.attempted_at, r.finalized_at FROM cyclone_jobs j "
                "JOIN cyclone_runs r ON r.id = j.run_id "
                "WHERE j.kind = 'first' AND j.run_id = ANY(:ids) ORDER BY j.attempted_at"
            ),
            {"ids": [run.id for run in held]},
        ).all()
    # Admitted one at a time, as the limit they kept (max 1) says: each run's first step
    # started after the run before it ended.
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), [
        (a.isoformat(), b.isoformat()) for a, b in spans
    ]


def test_a_run_parked_at_a_wait_keeps_its_workflow_slot_as_documented(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        name, concurrency=cyclone.Concurrency(1, key=lambda v: v["k"])
    )

    @wf.wait("go")
    def go(ctx: cyclone.StepContext, payload: int) -> int:
        return payload

    first = wf.submit(engine, {"k": "a"})
    second = wf.submit(engine, {"k": "a"})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=0.2))
    wait_until(lambda: jobs_of(engine, first) == 1)
    # The first run is parked at its wait, holding no worker, but it is in progress.
    assert in_progress(engine, name) == Counter({"a": 1})
    assert jobs_of(engine, second) == 0
    first.signal("go", 1)
    wait_until(lambda: first.status().state == "completed", timeout=20)
    wait_until(lambda: jobs_of(engine, second) == 1, timeout=20)
    second.cancel()


def test_a_rescue_that_gives_up_a_runs_step_admits_the_next_held_run_of_its_key_promptly(
    engine: sa.Engine, name: str, tmp_path: Path, serving: Any
) -> None:
    # Found by a review: a step lost with its worker too many times is failed by the
    # rescue, which fails its run and frees the run's slot. Nothing admitted the key's
    # held run nor rang, so it waited for a worker's poll.
    spec = {"limit": "workflow", "max": 1, "concurrency": 1}
    wf = workflow(name, spec)

    def last_loss(first: Any, second: Any) -> None:
        assert jobs_of(engine, second) == 0  # held
        lost_twice_before(engine, first.id, "first")

    first, second = a_worker_waits_for_the_slot_of_a_killed_worker(
        engine, name, spec, wf, serving, tmp_path, last_loss
    )
    # Well within the waiting worker's 600 s poll: a rescue under load takes a while.
    assert second.wait(timeout=90).state == cyclone.RunState.COMPLETED
    status = first.status()
    assert (status.state, status.failed_step) == (cyclone.RunState.FAILED, "first")
    assert status.error is not None
    assert status.error["type"] == "WorkerLost"


def test_a_run_past_its_deadline_admits_the_next_held_run_of_its_key_promptly(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # The leader fails a run past its deadline, which frees its slot: it rings, as a
    # cancel does, and the worker waiting admits the key's held run, not at its poll.
    wf, release = blocking_workflow(name)
    first = wf.submit(engine, {"k": "a", "n": 1}, deadline=timedelta(hours=1))
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=600)
    serving(worker)
    try:
        wait_until(lambda: started(engine, first), timeout=30)
        second = wf.submit(engine, {"k": "a", "n": 2})
        wait_until(lambda: asleep(engine, worker), timeout=30)
        assert jobs_of(engine, second) == 0  # held
        with engine.begin() as conn:  # its deadline passes now, the worker asleep
            conn.execute(
                sa.update(runs).where(runs.c.id == first.id).values(deadline=sa.func.now())
            )
        assert first.wait(timeout=30).state == cyclone.RunState.FAILED
        wait_until(lambda: started(engine, second), timeout=90)  # its step, blocked
    finally:
        release.set()
    assert second.wait(timeout=20).state == cyclone.RunState.COMPLETED
    error = first.status().error
    assert error is not None
    assert error["type"] == "DeadlineExceeded"


def test_a_held_run_past_its_deadline_frees_no_slot_and_rings_nothing(
    engine: sa.Engine, name: str
) -> None:
    # The leader's expiry rings for a run of a limited workflow whose slot it frees; a
    # held run failed freed none, and ringing for it would wake every sleeping worker
    # for nothing at each pass while held runs with deadlines pile up.
    wf: cyclone.Workflow[str] = cyclone.Workflow(
        name, input=str, concurrency=cyclone.Concurrency(1, key=lambda k: k)
    )
    wf.step("only")(lambda ctx, k: k)
    admitted = wf.submit(engine, "a", deadline=timedelta(hours=1))
    assert _limits_store.admit_runs(engine, (f"workflow:{name}",)) == 1
    held = wf.submit(engine, "a", deadline=timedelta(hours=1))
    expire = _rescue.expire_runs_stmt()

    def expire_now(run: Any) -> tuple[int, bool | None]:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(waiters).values(
                    worker_id="w", waits_until=sa.func.now() + timedelta(minutes=1)
                )
            )
            conn.execute(sa.update(runs).where(runs.c.id == run.id).values(deadline=sa.func.now()))
            failed, _cancelled, rang = conn.execute(expire).one()
            conn.execute(sa.delete(waiters))
        return failed, rang

    assert expire_now(held) == (1, None)
    assert expire_now(admitted) == (1, True)
    assert held.status().state == admitted.status().state == cyclone.RunState.FAILED


def test_a_worker_serving_only_a_limited_workflow_reads_when_its_next_held_run_falls_due(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # No limited step kind: the read of the next due time has no limit names of jobs. It
    # once rendered an empty IN list the compiled statement could not expand, failed on
    # every idle loop, and its logged tracebacks filled a worker's unread stderr pipe.
    spec = {"limit": "workflow", "max": 1}
    wf = workflow(name, spec)
    blocker = wf.submit(engine, {"k": "a", "ms": 0})
    later = wf.submit(engine, {"k": "a", "ms": 0}, delay=timedelta(seconds=30))
    held = _executor.Held(engine)
    try:
        seconds = _limits_store.seconds_until_gated_due(
            held, (), None, _limits_store.Served((), (name,)), (f"workflow:{name}",)
        )
    finally:
        held.close()
    assert seconds is not None
    assert 0 < seconds <= 30
    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=0.05)
    with caplog.at_level("ERROR", logger="cyclone.worker"):
        worker.drain()
    assert blocker.status().state == cyclone.RunState.COMPLETED
    assert later.status().state == cyclone.RunState.RUNNING  # held until its start
    assert not [r for r in caplog.records if "limited job may start" in r.getMessage()]


def test_an_admission_cancelling_in_progress_and_a_child_nodes_retry_of_its_limited_child(
    own_engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by a review: an admission locks the keys it serves, then cancels runs in
    # progress (cancel_in_progress); a child node's transaction locked its run, its job and
    # its ended child, then the key of that child's limit, to retry it. The admission held
    # that key and waited for the parent run: a deadlock. Every transaction that waits for
    # a limit's key now takes it before any run.
    kid: cyclone.Workflow[int] = cyclone.Workflow(
        f"{name}-kid", input=int, concurrency=cyclone.Concurrency(1)
    )

    @kid.step(max_attempts=1)
    def work(ctx: cyclone.StepContext, n: int) -> None:
        raise RuntimeError("no")

    top: cyclone.Workflow[int] = cyclone.Workflow(
        name, input=int, concurrency=cyclone.Concurrency(1, on_limit="cancel_in_progress")
    )

    @top.child(kid)
    def sub(ctx: cyclone.StepContext, n: int) -> int:
        return n

    parent = top.submit(own_engine, 1)
    with cyclone.Worker(own_engine, workflows=[top, kid], sweep=False) as worker:
        worker.drain()
    (child,) = parent.children()
    assert [r.status().state.value for r in (parent, child)] == ["failed", "failed"]
    parent.retry()  # in progress again; its node, run again, retries the failed child
    names = (f"workflow:{name}", f"workflow:{name}-kid")
    with caplog.at_level("WARNING", logger="cyclone.worker"), own_engine.connect() as holder:
        # The child held: the node's transaction waits to adopt it, holding the parent
        # (and, fixed, the child's key, taken first).
        holder.execute(
            sa.text("SELECT id FROM cyclone_runs WHERE id = :r FOR UPDATE"), {"r": child.id}
        )
        # One slot: while the node runs, this worker neither claims nor admits.
        deciding = Background(
            cyclone.Worker(own_engine, workflows=[top], concurrency=1, sweep=False).drain,
            name="child-node",
        )
        wait_until(lambda: waiting_on_locks(own_engine) >= 1, 10)
        newer = top.submit(own_engine, 2)  # the admission cancels the parent for it
        queued = kid.submit(own_engine, 3)  # so the admission locks the child's key too
        admitting = Background(
            lambda: _limits_store.admit_runs(own_engine, names), name="admission"
        )
        wait_until(lambda: waiting_on_locks(own_engine) >= 2, 10)
        holder.rollback()
        assert admitting.join(30) == 1  # the newer run; the child's key was not free
        deciding.join(30)
    assert "deadlock" not in caplog.text
    # The node retried its child, then the admission cancelled the parent and that child.
    assert [r.status().state.value for r in (parent, child)] == ["cancelled", "cancelled"]
    assert [e["type"] for e in (parent.status().error or {},)] == ["ConcurrencyLimit"]
    newer.cancel()
    queued.cancel()


def test_an_admission_over_several_keys_and_a_bulk_cancel_lock_their_runs_in_one_order(
    own_engine: sa.Engine, name: str
) -> None:
    # An admission serving two keys cancelled (and admitted) the runs of one key, then of
    # the next: runs locked key by key, not in the run lock order. A bulk cancel locks
    # its batch in the run lock order: holding an older run of the second key, it waited
    # for the first key's run the admission held, while the admission, done with the
    # first key, waited for that older run to cancel it: a deadlock. The admission now
    # locks every run it cancels or admits, over all its keys, in one statement, in the
    # run lock order, before it acts on any.
    wf: cyclone.Workflow[str] = cyclone.Workflow(
        name,
        input=str,
        concurrency=cyclone.Concurrency(1, key=lambda k: k, on_limit="cancel_in_progress"),
    )

    @wf.step()
    def work(ctx: cyclone.StepContext, k: str) -> str:
        return k

    limit = f"workflow:{name}"
    old_b = wf.submit(own_engine, "b")  # the oldest run: first in the run lock order
    old_a = wf.submit(own_engine, "a")
    assert _limits_store.admit_runs(own_engine, (limit,)) == 2
    start_runs(own_engine, wf)  # their steps exist, not claimed
    new_b = wf.submit(own_engine, "b")  # held; each admits it over its key's older run
    new_a = wf.submit(own_engine, "a")
    with own_engine.begin() as conn:  # the key "a" is served first
        conn.execute(
            sa.text(
                "UPDATE cyclone_limit_keys SET served_at = now() - "
                "CASE key WHEN 'a' THEN interval '2 minutes' ELSE interval '1 minute' END "
                "WHERE name = :n"
            ),
            {"n": limit},
        )
    client = cyclone.Client(own_engine)
    with own_engine.connect() as holder:
        # The step of the run of "a" held: the admission waits to cancel it, holding that
        # run (and, fixed, every run it acts on).
        holder.execute(
            sa.text("SELECT id FROM cyclone_jobs WHERE run_id = :r FOR UPDATE"), {"r": old_a.id}
        )
        admitting = Background(
            lambda: _limits_store.admit_runs(own_engine, (limit,)), name="admission"
        )
        wait_until(lambda: waiting_on_locks(own_engine) >= 1, 10)
        # The bulk cancel locks the oldest run (the run of "b"), then waits for the run of
        # "a" (fixed: it waits for the oldest run, which the admission holds).
        cancelling = Background(lambda: client.cancel_runs(workflow=name), name="bulk-cancel")
        wait_until(lambda: waiting_on_locks(own_engine) >= 2, 10)
        holder.rollback()
    assert admitting.join(30) == 2  # the two new runs
    assert cancelling.join(30) == 2  # the two new runs; the old ones ended meanwhile
    runs_ = (old_a, old_b, new_a, new_b)
    assert [r.status().state.value for r in runs_] == ["cancelled"] * 4
    assert [(r.status().error or {}).get("type") for r in runs_] == [
        "ConcurrencyLimit",
        "ConcurrencyLimit",
        None,
        None,
    ]


def test_an_admission_counts_the_keys_with_room_another_transaction_held_as_contended(
    engine: sa.Engine, name: str
) -> None:
    """An admission skips a key another transaction holds (``SKIP LOCKED``): it counts
    those with a held run due and room, as the limited claim counts its keys, and not a
    key held that is full."""
    wf: cyclone.Workflow[str] = cyclone.Workflow(
        name, input=str, concurrency=cyclone.Concurrency(1, key=lambda k: k)
    )
    wf.step("only")(lambda ctx, k: k)
    limit = f"workflow:{name}"
    wf.submit(engine, "full")
    assert _limits_store.admit_runs(engine, (limit,)) == 1
    full, a, b = (wf.submit(engine, k) for k in ("full", "a", "b"))  # "full" held
    counted: list[int] = []
    with engine.connect() as holder:
        holder.execute(
            sa.text(
                "SELECT 1 FROM cyclone_limit_keys WHERE name = :n AND key IN ('a', 'full') "
                "FOR UPDATE"
            ),
            {"n": limit},
        )
        assert _limits_store.admit_runs(engine, (limit,), contended=counted) == 1  # b
        holder.rollback()
    assert counted == [1]  # "a"; "full" has no room
    assert _limits_store.admit_runs(engine, (limit,), contended=counted) == 1  # a
    assert counted == [1, 0]
    assert [jobs_of(engine, run) for run in (full, a, b)] == [0, 0, 0]
    assert in_progress(engine, name) == Counter({"full": 1, "a": 1, "b": 1})
    assert cyclone.Client(engine).cancel_runs(workflow=name) == 4


def held_in_turn(engine: sa.Engine, wf: cyclone.Workflow[str], keys: str) -> None:
    """Submit a run of each of ``keys`` (one-letter keys of a ``Concurrency(1)`` keyed on
    the input, so each is held with room) and make the keys last served in that order."""
    for k in keys:
        wf.submit(engine, k)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE cyclone_limit_keys SET served_at = now() - interval '1 hour' + "
                "array_position(:keys, key) * interval '1 second' WHERE name = :n"
            ),
            {"keys": list(keys), "n": f"workflow:{wf.name}"},
        )


@pytest.mark.parametrize("on_limit", ["queue", "cancel_newest"])
def test_an_admission_counts_a_skipped_key_though_keys_after_it_fill_its_batch(
    engine: sa.Engine, name: str, on_limit: Any
) -> None:
    """The least recently served of three keys with room and a held run due is held by
    another transaction; an admission of two keys skips it, takes the two after it, and
    counts it. The count was a difference of two walks (the first two keys read
    unlocked, less the keys locked), which the keys after the skipped one made 0: the
    skipped key's held run waited for the worker's poll."""
    wf: cyclone.Workflow[str] = cyclone.Workflow(
        name, input=str, concurrency=cyclone.Concurrency(1, key=lambda k: k, on_limit=on_limit)
    )
    wf.step("only")(lambda ctx, k: k)
    limit = f"workflow:{name}"
    held_in_turn(engine, wf, "abc")
    counted: list[int] = []
    with engine.connect() as holder:
        holder.execute(
            sa.text("SELECT 1 FROM cyclone_limit_keys WHERE name = :n AND key = 'a' FOR UPDATE"),
            {"n": limit},
        )
        assert _limits_store.admit_runs(engine, (limit,), batch=2, contended=counted) == 2
        holder.rollback()
    assert counted == [1]  # "a"
    assert in_progress(engine, name) == Counter({"b": 1, "c": 1})
    assert _limits_store.admit_runs(engine, (limit,), batch=2, contended=counted) == 1
    assert counted == [1, 0]
    assert in_progress(engine, name) == Counter({"a": 1, "b": 1, "c": 1})
    assert cyclone.Client(engine).cancel_runs(workflow=name) == 3


def test_two_admissions_at_once_serve_two_batches_of_keys(engine: sa.Engine, name: str) -> None:
    """An admission holds the first batch of keys; another, whose snapshot still shows
    them first in turn, skips them and serves the next batch rather than none (it
    counts the keys skipped, which come before those it took)."""
    wf: cyclone.Workflow[str] = cyclone.Workflow(
        name, input=str, concurrency=cyclone.Concurrency(1, key=lambda k: k)
    )
    wf.step("only")(lambda ctx, k: k)
    limit = f"workflow:{name}"
    held_in_turn(engine, wf, "abcde")
    counted: list[int] = []
    with engine.connect() as first:
        locked = first.execute(
            _limits_store.lock_held_keys_stmt((limit,), 2)
        ).all()  # the first admission's keys, held until it ends
        assert [row[1] for row in locked] == ["a", "b"]
        assert _limits_store.admit_runs(engine, (limit,), batch=2, contended=counted) == 2
        first.rollback()
    assert counted == [2]  # "a" and "b", before "d"
    assert in_progress(engine, name) == Counter({"c": 1, "d": 1})
    assert cyclone.Client(engine).cancel_runs(workflow=name) == 5


def test_a_held_run_whose_key_another_transaction_held_at_admission_starts_shortly_not_at_the_poll(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # Another transaction holds the workflow limit's key (another worker's admission; a
    # retry's, a fork's or a child node's check of room): the admission skips it,
    # nothing rings when that transaction ends, and nothing falls due. The admission
    # reported nothing of the key, so the worker slept until its poll with a held run
    # that had room.
    wf: cyclone.Workflow[int] = cyclone.Workflow(
        name, input=int, concurrency=cyclone.Concurrency(1)
    )
    wf.step("only")(lambda ctx, n: n)
    run = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=600)
    with engine.connect() as holder:
        holder.execute(
            sa.text("SELECT 1 FROM cyclone_limit_keys WHERE name = :n FOR UPDATE"),
            {"n": f"workflow:{name}"},
        )
        serving(worker)
        # Held until the worker either looks again for the key it could not lock, or
        # sleeps (until its poll) having seen no contention.
        wait_until(lambda: worker._contention_looks >= 3 or asleep(engine, worker), timeout=30)
        assert jobs_of(engine, run) == 0  # still held
        holder.commit()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
