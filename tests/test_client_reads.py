"""``cyclone.Client``'s reads for front ends: one snapshot, bounded pages, details and the
counts a dashboard shows."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone.client import ActiveJobs
from cyclone.schema import jobs

pytestmark = pytest.mark.usefixtures("clean_tables")


def checks(name: str) -> cyclone.Workflow[int]:
    """One step that fails for good on a negative input."""
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step(max_attempts=1)
    def check(ctx: cyclone.StepContext, n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    return wf


def test_a_snapshot_reads_one_moment_while_others_commit(engine: sa.Engine, name: str) -> None:
    wf = checks(name)
    wf.submit_once(engine, "a", 1)
    client = cyclone.Client(engine)
    with client.snapshot() as reader:
        assert reader.count_runs(workflow=name)[cyclone.RunState.RUNNING] == 1
        wf.submit_once(engine, "b", 2)  # committed on another connection
        assert reader.count_runs(workflow=name)[cyclone.RunState.RUNNING] == 1
        assert [r.key for r in reader.list_runs(workflow=name)] == ["a"]
        assert reader.count_runs_per_workflow()[name][cyclone.RunState.RUNNING] == 1
        assert client.count_runs(workflow=name)[cyclone.RunState.RUNNING] == 2
    assert [r.key for r in client.list_runs(workflow=name)] == ["b", "a"]


def test_page_runs_bounds_a_key_prefix_and_goes_on_where_it_stopped(
    engine: sa.Engine, name: str
) -> None:
    wf = checks(name)
    wf.submit_once_many(engine, [(f"old{i}", -1) for i in range(2)])
    cyclone.Worker(engine, workflows=[wf]).drain()  # the two oldest runs fail
    wf.submit_once_many(engine, [(f"new{i:02d}", i) for i in range(10)])
    client = cyclone.Client(engine)

    pages = []
    after: Any = None
    while True:
        page = client.page_runs(workflow=name, key="old*", after=after, limit=50, scan=5)
        pages.append(page)
        if page.next is None:
            break
        after = page.next
    assert [sorted(r.key or "" for r in p.runs) for p in pages] == [[], [], ["old0", "old1"]]
    assert [p.searched_to is not None for p in pages] == [True, True, False]
    assert pages[0].next is not None
    assert pages[0].searched_to == pages[0].next.created_at
    # A state has its index: one page holds every match, however few (no window read).
    failed = client.page_runs(workflow=name, state="failed", limit=50, scan=5)
    assert (sorted(r.key or "" for r in failed.runs), failed.searched_to) == (
        ["old0", "old1"],
        None,
    )

    first = client.page_runs(workflow=name, limit=3)
    assert first.runs == client.list_runs(workflow=name, limit=3)
    assert first.next == first.runs[-1]
    assert first.searched_to is None
    following = client.page_runs(workflow=name, limit=3, after=first.next)
    assert following.runs == client.list_runs(workflow=name, limit=3, after=first.next)
    prefix = client.page_runs(key="new0*", scan=100)
    assert sorted(r.key or "" for r in prefix.runs) == [f"new{i:02d}" for i in range(10)]
    assert [r.key for r in client.page_runs(key="old1").runs] == ["old1"]
    since = first.runs[-1].created_at
    assert client.page_runs(workflow=name, since=since).runs == client.list_runs(since=since)
    assert {r.key for r in client.page_runs(until=since).runs} == {"old0", "old1"}
    with pytest.raises(ValueError, match="until must be an aware datetime"):
        client.page_runs(until=since.replace(tzinfo=None))
    assert client.list_workflows() == [name]


def test_run_detail_has_the_graph_outputs_workers_and_the_database_clock(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(name, input=int, output=int)

    @wf.step()
    def double(ctx: cyclone.StepContext, n: int) -> int:
        return 2 * n

    @wf.result(after=[double])
    def total(ctx: cyclone.StepContext, n: int) -> int:
        return ctx.output(double) + n

    run, _ = wf.submit_once(engine, "k", 3)
    client = cyclone.Client(engine)
    pending = client.get_run_detail(run.id)
    assert pending is not None
    assert [s["name"] for s in pending.graph["steps"]] == ["double", "total"]
    assert [(s.output, s.worker_id) for s in pending.steps] == [(None, None), (None, None)]
    cyclone.Worker(engine, workflows=[wf]).drain()
    detail = client.get_run_detail(run.id)
    assert detail is not None
    assert [(s.name, s.output) for s in detail.steps] == [("double", 6), ("total", 9)]
    assert all(s.worker_id for s in detail.steps)
    assert detail.result == 9
    assert detail.steps_remaining == 0
    assert detail.read_at.tzinfo is not None
    assert detail.status.finished_at is not None
    assert detail.status.finished_at <= detail.read_at


def test_active_jobs_and_finished_minutes_are_counted_per_queue_kind_and_minute(
    engine: sa.Engine, name: str
) -> None:
    @cyclone.step(f"{name}.job")
    def job(ctx: cyclone.StepContext, n: int) -> int:
        return n

    job.enqueue(engine, 1, queue=f"{name}-q")
    job.enqueue(engine, 2, queue=f"{name}-q")
    job.enqueue(engine, 3, queue=f"{name}-q", delay=timedelta(hours=1))
    checks(name).submit(engine, 1)  # not started: its root counts as available
    client = cyclone.Client(engine)
    assert client.count_active_jobs() == [
        ActiveJobs("default", name, "check", ready=1, scheduled=0, running=0),
        ActiveJobs(f"{name}-q", None, f"{name}.job", ready=2, scheduled=1, running=0),
    ]
    assert cyclone.Worker(engine, steps=[job]).drain() == 2
    minutes = client.count_finished_per_minute(minutes=5)
    assert len(minutes) == 5
    assert all(m.minute.tzinfo is not None and m.minute.second == 0 for m in minutes)
    assert [b.minute - a.minute for a, b in itertools.pairwise(minutes)] == [
        timedelta(minutes=1)
    ] * 4
    assert (sum(m.completed for m in minutes), sum(m.failed for m in minutes)) == (2, 0)
    assert client.count_active_jobs()[1] == ActiveJobs(
        f"{name}-q", None, f"{name}.job", ready=0, scheduled=1, running=0
    )


def test_job_detail_of_a_step_names_its_run_workflow_and_item(engine: sa.Engine, name: str) -> None:
    """Worker logs and ``StepStatus.job_id`` give the ids of steps' jobs: the detail of one
    is that job, naming its run (it was None, as if the job did not exist)."""
    wf: cyclone.ResultWorkflow[int, list[int]] = cyclone.ResultWorkflow(
        name, input=int, output=list[int]
    )

    @wf.step(max_attempts=2)
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        if ctx.attempt == 1:
            raise RuntimeError("first try")
        return list(range(n))

    @wf.map(over=numbers)
    def square(ctx: cyclone.StepContext, i: int) -> int:
        return i * i

    @wf.result(after=[square])
    def total(ctx: cyclone.StepContext, n: int) -> list[int]:
        return ctx.output(square)

    run, _ = wf.submit_once(engine, "k", 3)
    cyclone.Worker(engine, workflows=[wf], backoff=lambda n: 0.0).drain()
    assert run.result(timeout=10) == [0, 1, 4]
    client = cyclone.Client(engine)
    steps = client.get_run_detail(run.id)
    assert steps is not None
    job_id = steps.steps[0].job_id
    assert job_id is not None

    detail = client.get_job_detail(job_id)
    assert detail is not None
    assert (detail.run_id, detail.workflow, detail.item) == (run.id, name, None)
    assert (detail.status.id, detail.status.kind, detail.status.state) == (
        job_id,
        "numbers",
        cyclone.JobState.COMPLETED,
    )
    assert (detail.status.attempt, detail.status.max_attempts) == (2, 2)
    assert [e["message"] for e in detail.status.errors] == ["first try"]
    assert detail.args == 3  # what the step ran with: its run's input
    assert detail.output == [0, 1, 2]
    assert detail.worker_id == steps.steps[0].worker_id
    assert detail.started_at == steps.steps[0].started_at

    with engine.connect() as conn:
        item_id = conn.execute(
            sa.select(jobs.c.id).where(jobs.c.run_id == run.id, jobs.c.item == 2)
        ).scalar_one()
    item = client.get_job_detail(item_id)
    assert item is not None
    assert (item.run_id, item.workflow, item.item, item.status.kind) == (run.id, name, 2, "square")
    assert (item.args, item.output) == (2, 4)

    # A standalone job names no run; get_job stays the standalone jobs' read.
    @cyclone.step(f"{name}.mail")
    def mail(ctx: cyclone.StepContext, to: str) -> None:
        return None

    job = mail.enqueue(engine, "ada")
    alone = client.get_job_detail(job.id)
    assert alone is not None
    assert (alone.run_id, alone.workflow, alone.item, alone.args) == (None, None, None, "ada")
    assert client.get_job(job_id) is None
