"""Paused queues: their jobs are not claimed by any worker, and resuming wakes workers.

``Client.pause_queue``, ``Client.resume_queue`` and ``Client.list_queues``; the claim
statement reads the paused queues once per statement. Every queue paused here is named
for its test, so no other test's queue is ever paused.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import claim as _claim
from tests.support.workers import Background


@pytest.fixture
def client(engine: sa.Engine) -> Iterator[cyclone.Client]:
    client = cyclone.Client(engine)
    yield client
    for queue in client.list_queues():
        if queue.paused:
            client.resume_queue(queue.name)


def kind_in(
    kind: str, queue: str, ran: list[str] | None = None
) -> cyclone.StandaloneStep[Any, str]:
    @cyclone.step(kind, queue=queue)
    def work(ctx: cyclone.StepContext, args: Any) -> str:
        if ran is not None:
            ran.append(f"{queue}:{args}")
        return str(args)

    return work


def test_a_paused_queues_jobs_stay_available_while_another_queues_jobs_run(
    engine: sa.Engine, name: str, client: cyclone.Client
) -> None:
    ran: list[str] = []
    held = kind_in(f"{name}_a", f"{name}_held", ran)
    served = kind_in(f"{name}_b", f"{name}_served", ran)
    assert client.pause_queue(f"{name}_held") is True
    waiting = held.enqueue(engine, 1)
    done = served.enqueue(engine, 2)

    worker = cyclone.Worker(engine, steps=[held, served])
    assert worker.drain() == 1
    assert ran == [f"{name}_served:2"]
    assert done.status().state == cyclone.JobState.COMPLETED
    assert waiting.status().state == cyclone.JobState.AVAILABLE
    queues = {q.name: q for q in client.list_queues()}
    assert queues[f"{name}_held"].paused
    assert queues[f"{name}_held"].paused_at is not None
    assert (queues[f"{name}_held"].available, queues[f"{name}_held"].running) == (1, 0)

    assert client.resume_queue(f"{name}_held") is True
    assert worker.drain() == 1
    assert waiting.result(timeout=5) == "1"
    queues = {q.name: q for q in client.list_queues()}
    assert not queues[f"{name}_held"].paused
    assert queues[f"{name}_held"].paused_at is None


def test_resuming_a_queue_wakes_idle_running_workers_at_once(
    engine: sa.Engine, name: str, client: cyclone.Client, serving: Any
) -> None:
    held = kind_in(f"{name}_a", f"{name}_held")
    other = kind_in(f"{name}_b", f"{name}_other")
    client.pause_queue(f"{name}_held")
    jobs = [held.enqueue(engine, i) for i in range(3)]
    # Two workers poll every 60 s: only a NOTIFY can wake them within the test.
    for _ in range(2):
        serving(cyclone.Worker(engine, steps=[held, other], poll_interval=60))
    assert other.enqueue(engine, "x").result(timeout=10) == "x"  # they run the other queue
    assert {j.status().state for j in jobs} == {cyclone.JobState.AVAILABLE}

    client.resume_queue(f"{name}_held")
    assert [j.result(timeout=10) for j in jobs] == ["0", "1", "2"]


def test_a_paused_queue_holds_the_steps_of_runs_and_their_run_waits(
    engine: sa.Engine, name: str, client: cyclone.Client
) -> None:
    wf = cyclone.ResultWorkflow(name, output=int)
    queue = f"{name}_slow"

    @wf.step()
    def first(ctx: cyclone.StepContext, value: int) -> int:
        return value + 1

    @wf.step(after=[first], queue=queue)
    def held(ctx: cyclone.StepContext, value: int) -> int:
        return ctx.output(first) * 10

    @wf.result(after=[held])
    def result(ctx: cyclone.StepContext, value: int) -> int:
        return ctx.output(held)

    @wf.step(queue=queue)
    def root_held(ctx: cyclone.StepContext, value: int) -> None: ...

    client.pause_queue(queue)
    run = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf])
    assert worker.drain() == 1  # the run starts; of its roots only `first` runs
    detail = client.get_run_detail(run.id)
    assert detail is not None
    states = {s.name: s.state.value for s in detail.steps}
    assert states == {
        "first": "completed",
        "held": "available",
        "result": "blocked",
        "root_held": "available",
    }
    assert run.status().state == cyclone.RunState.RUNNING

    client.resume_queue(queue)
    worker.drain()
    assert run.result(timeout=5) == 20


def test_pause_and_resume_say_whether_they_changed_anything(
    name: str, client: cyclone.Client
) -> None:
    queue = f"{name}_q"
    assert client.resume_queue(queue) is False  # never paused
    assert client.pause_queue(queue) is True
    assert client.pause_queue(queue) is False
    paused_at = {q.name: q.paused_at for q in client.list_queues()}[queue]
    assert client.pause_queue(queue) is False
    assert {q.name: q.paused_at for q in client.list_queues()}[queue] == paused_at
    assert client.resume_queue(queue) is True
    assert client.resume_queue(queue) is False
    with pytest.raises(ValueError, match="queue must be a non-empty str"):
        client.pause_queue("")


def test_list_queues_counts_available_scheduled_and_running_jobs_per_queue(
    engine: sa.Engine, name: str, client: cyclone.Client
) -> None:
    started, release = threading.Event(), threading.Event()

    @cyclone.step(f"{name}_slow", queue=f"{name}_q")
    def slow(ctx: cyclone.StepContext, args: Any) -> None:
        started.set()
        assert release.wait(10)

    slow.enqueue(engine, 1)
    slow.enqueue(engine, 2)
    later = slow.enqueue(engine, 3, delay=timedelta(hours=1))
    worker = cyclone.Worker(engine, steps=[slow], concurrency=1)
    draining = Background(worker.drain)
    assert started.wait(10)
    client.pause_queue(f"{name}_q")  # the running job goes on; the other waits
    queue = {q.name: q for q in client.list_queues()}[f"{name}_q"]
    assert (queue.paused, queue.available, queue.scheduled, queue.running) == (True, 1, 1, 1)
    release.set()
    assert draining.join(10) == 1
    later.cancel()


def test_the_claim_reads_its_index_in_order_whatever_the_paused_queues(
    own_engine: sa.Engine, name: str
) -> None:
    """The planner must not take the paused-queue test for a selective one.

    Written as ``queue <> ALL(paused)``, a generic plan estimated it from the queue
    column's statistics (two queues: as if one job in a thousand passed) and read and
    sorted the whole backlog on every claim (140 ms at 200,000 jobs instead of 0.5 ms).
    """
    with own_engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, queue, state, max_attempts, args) "
                "SELECT 'k', CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 'available', 3, "
                "'{}'::jsonb FROM generate_series(1, 20000) g"
            )
        )
        c.execute(sa.text("ANALYZE cyclone_jobs"))
    scopes = [
        _claim.Scope(queues=None, workflows=(), kinds=("k",)),
        _claim.Scope(queues=("a",), workflows=(), kinds=("k",)),
        _claim.Scope(queues=None, workflows=("w",), kinds=("k",)),
    ]
    url = own_engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as raw:
        raw.execute("SET plan_cache_mode = force_generic_plan")
        for scope in scopes:
            compiled = _claim._fast_claim(scope, False, 10, False)
            params = {**compiled.defaults, "me": "x", "items": "[]"}
            plan = "\n".join(r[0] for r in raw.execute("EXPLAIN " + compiled.sql, params))
            assert "ix_cyclone_jobs_claim_kind" in plan, plan
            assert not re.search(r"Seq Scan on cyclone_jobs", plan), plan
    with own_engine.begin() as c:
        c.execute(sa.text("DELETE FROM cyclone_jobs"))
