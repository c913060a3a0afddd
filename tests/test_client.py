"""``cyclone.Client``: listing, keyset pagination, lookups and counts of runs and jobs."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone.schema import jobs, runs
from tests.conftest import StatementCounter
from tests.support.workers import start_runs

pytestmark = pytest.mark.usefixtures("clean_tables")


@pytest.fixture
def client(engine: sa.Engine) -> cyclone.Client:
    return cyclone.Client(engine)


def flaky_workflow(name: str) -> cyclone.Workflow[int]:
    """A workflow whose single step fails for good when its input is negative."""
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step(max_attempts=1)
    def check(ctx: cyclone.StepContext, n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    return wf


@pytest.fixture
def four_states(engine: sa.Engine, name: str) -> dict[cyclone.RunState, cyclone.Run]:
    """One run per state, submitted in this order: completed, failed, cancelled, running."""
    wf = flaky_workflow(name)
    completed, _ = wf.submit_once(engine, "completed", 1)
    failed, _ = wf.submit_once(engine, "failed", -1)
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 2
    cancelled, _ = wf.submit_once(engine, "cancelled", 3)
    cancelled.cancel()
    running, _ = wf.submit_once(engine, "running", 4)
    return {
        cyclone.RunState.COMPLETED: completed,
        cyclone.RunState.FAILED: failed,
        cyclone.RunState.CANCELLED: cancelled,
        cyclone.RunState.RUNNING: running,
    }


def test_list_runs_is_newest_first(
    client: cyclone.Client, name: str, four_states: dict[cyclone.RunState, cyclone.Run]
) -> None:
    listed = client.list_runs(workflow=name)
    assert [r.id for r in listed] == [r.id for r in reversed(four_states.values())]
    assert [r.state for r in listed] == list(reversed(four_states))
    assert all(a.created_at >= b.created_at for a, b in itertools.pairwise(listed))


def test_list_runs_filters_by_workflow_state_and_key(
    engine: sa.Engine,
    client: cyclone.Client,
    name: str,
    four_states: dict[cyclone.RunState, cyclone.Run],
) -> None:
    other = flaky_workflow(f"{name}-other")
    other_run, _ = other.submit_once(engine, "failed", 5)
    assert {r.id for r in client.list_runs()} == {
        *(r.id for r in four_states.values()),
        other_run.id,
    }
    assert [r.id for r in client.list_runs(workflow=f"{name}-other")] == [other_run.id]
    for state, run in four_states.items():
        assert [r.id for r in client.list_runs(workflow=name, state=state)] == [run.id]
        assert [r.id for r in client.list_runs(workflow=name, state=state.value)] == [run.id]
    assert {r.id for r in client.list_runs(key="failed")} == {
        four_states[cyclone.RunState.FAILED].id,
        other_run.id,
    }
    assert client.list_runs(workflow=name, key="failed", state=cyclone.RunState.RUNNING) == []
    failed = client.list_runs(workflow=name, state=cyclone.RunState.FAILED)[0]
    assert failed.failed_step == "check"
    assert failed.error is not None
    assert failed.error["message"] == "negative"


def test_a_workflow_filter_takes_the_workflow_or_its_name_and_refuses_anything_else(
    engine: sa.Engine,
    client: cyclone.Client,
    name: str,
    four_states: dict[cyclone.RunState, cyclone.Run],
) -> None:
    wf = flaky_workflow(name)
    other, _ = flaky_workflow(f"{name}-other").submit_once(engine, "failed", 5)
    assert [r.id for r in client.list_runs(workflow=wf)] == [
        r.id for r in client.list_runs(workflow=name)
    ]
    assert other.id not in {r.id for r in client.list_runs(workflow=wf)}
    assert client.count_runs(workflow=wf) == client.count_runs(workflow=name)
    assert client.count_parked_runs(workflow=wf) == client.count_parked_runs(workflow=name)
    assert client.page_runs(workflow=wf).runs == client.page_runs(workflow=name).runs
    running = four_states[cyclone.RunState.RUNNING].id
    assert client.cancel_runs(workflow=wf, dry_run=True) == 1
    assert client.get_run_by_key(wf, "running") == client.get_run(running)
    for wrong in (42, b"name", object()):
        with pytest.raises(TypeError, match="workflow= takes a workflow's name or the Workflow"):
            client.list_runs(workflow=wrong)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="workflow= takes"):
            client.retry_runs(workflow=wrong)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="workflow= takes"):
            client.count_runs(workflow=wrong)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not None"):
        client.get_run_by_key(None, "running")  # type: ignore[arg-type]


def test_list_runs_limit_caps_the_page_and_must_be_positive(
    client: cyclone.Client, name: str, four_states: dict[cyclone.RunState, cyclone.Run]
) -> None:
    assert len(client.list_runs(limit=3)) == 3
    with pytest.raises(ValueError, match="limit"):
        client.list_runs(limit=0)


def test_bad_read_arguments_are_typed_errors_before_a_statement(
    client: cyclone.Client, statements: StatementCounter
) -> None:
    """Each of these failed in the driver or its encoder (an operator error, "cannot
    contain NUL (0x00) bytes", "bigint out of range", UnicodeEncodeError) or with an
    AttributeError; a NUL, a lone surrogate, a page past PostgreSQL's integer names
    nothing that can be stored."""
    many = 2**70
    wrong: list[tuple[type[Exception], str, Callable[[], object]]] = [
        (ValueError, "NUL", lambda: client.list_runs(key="a\x00")),
        (ValueError, "NUL", lambda: client.list_runs(workflow="a\x00")),
        (ValueError, "UTF-8", lambda: client.page_runs(key="\ud800")),
        (ValueError, "UTF-8", lambda: client.get_run_by_key("\ud800", "k")),
        (ValueError, "NUL", lambda: client.cancel_runs(workflow="a\x00", dry_run=True)),
        (ValueError, "NUL", lambda: client.list_jobs(kind="a\x00")),
        (ValueError, "NUL", lambda: client.list_jobs(queue="a\x00")),
        (ValueError, "NUL", lambda: client.count_jobs(queue="a\x00")),
        (ValueError, "NUL", lambda: client.pause_queue("a\x00")),
        (TypeError, "key= takes a str", lambda: client.list_runs(key=5)),  # type: ignore[arg-type]
        (TypeError, "key= takes a str", lambda: client.page_runs(key=5)),  # type: ignore[arg-type]
        (TypeError, "kind= takes a str", lambda: client.list_jobs(kind=5)),  # type: ignore[arg-type]
        (TypeError, "after= takes", lambda: client.list_runs(after=5)),  # type: ignore[arg-type]
        (TypeError, "after= takes", lambda: client.list_jobs(after=5)),  # type: ignore[arg-type]
        (ValueError, "at most", lambda: client.list_runs(limit=many)),
        (ValueError, "at most", lambda: client.page_runs(limit=many)),
        (ValueError, "at most", lambda: client.list_jobs(limit=many)),
        (ValueError, "at most", lambda: client.retry_runs(batch_size=many)),
        (
            ValueError,
            "children_limit",
            lambda: client.get_run_detail(uuid.uuid4(), children_limit=many),
        ),
        (
            TypeError,
            "children_limit takes an int or None, not str",
            lambda: client.get_run_detail(uuid.uuid4(), children_limit="x"),
        ),  # type: ignore[arg-type]
        (TypeError, "a run id is", lambda: client.get_run(None)),  # type: ignore[arg-type]
        # A job cursor's id past bigint, as text or on a position: "bigint out of range".
        (
            ValueError,
            "not a cursor",
            lambda: client.list_jobs(after=f"2026-01-01T00:00:00+00:00~{2**63}"),
        ),
        (
            ValueError,
            "not a cursor",
            lambda: client.list_jobs(
                after=SimpleNamespace(created_at=datetime.now(UTC), id=2**63)  # type: ignore[arg-type]
            ),
        ),
        (TypeError, "a run id is", lambda: client.get_run(5)),  # type: ignore[arg-type]
    ]
    statements.reset()
    for error, message, call in wrong:
        with pytest.raises(error, match=message):
            call()
    assert statements.statements == []


def all_pages(
    client: cyclone.Client, limit: int, **filters: object
) -> Iterator[list[cyclone.RunStatus]]:
    after = None
    while True:
        page = client.list_runs(limit=limit, after=after, **filters)  # type: ignore[arg-type]
        if not page:
            return
        yield page
        after = page[-1]


def submit_many(
    engine: sa.Engine, wf: cyclone.Workflow[int], prefix: str, count: int
) -> set[uuid.UUID]:
    ids: set[uuid.UUID] = set()
    for start in range(0, count, 500):  # several transactions: several created_at values
        items = [(f"{prefix}{i}", i) for i in range(start, min(count, start + 500))]
        ids |= {run.id for run, created in wf.submit_once_many(engine, items) if created}
    assert len(ids) == count
    return ids


def test_keyset_pagination_visits_every_run_exactly_once(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = flaky_workflow(name)
    expected = submit_many(engine, wf, "k", 3000)
    visited = [run.id for page in all_pages(client, 97, workflow=name) for run in page]
    assert len(visited) == len(set(visited)) == 3000
    assert set(visited) == expected


def test_keyset_pagination_has_no_gaps_or_repeats_while_runs_are_submitted(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = flaky_workflow(name)
    expected = submit_many(engine, wf, "old", 3000)
    new_ids: set[uuid.UUID] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def submit_meanwhile() -> None:
        try:
            i = 0
            while not stop.is_set():
                items = [(f"new{i}-{j}", j) for j in range(5)]
                new_ids.update(run.id for run, _ in wf.submit_once_many(engine, items))
                i += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=submit_meanwhile)
    thread.start()
    try:
        visited: list[uuid.UUID] = []
        for page in all_pages(client, 100, workflow=name):
            visited += [run.id for run in page]
            # and from this thread, between pages, so new runs land mid-pagination
            new_ids.update(
                r.id for r, _ in wf.submit_once_many(engine, [(f"mid{len(visited)}", 0)])
            )
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors
    assert len(new_ids) > 30  # runs really were submitted during the paging
    assert len(visited) == len(set(visited))  # no repeats
    assert expected <= set(visited)  # no gaps
    assert set(visited) - expected <= new_ids  # nothing else


def test_iter_runs_yields_every_matching_run_newest_first(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = flaky_workflow(name)
    runs = [wf.submit(engine, i) for i in range(23)]
    flaky_workflow(f"{name}-other").submit(engine, 0)
    listed = list(client.iter_runs(page_size=5, workflow=name))
    assert [r.id for r in listed] == [r.id for r in reversed(runs)]
    assert len(list(client.iter_runs(page_size=4))) == 24
    assert list(client.iter_runs(workflow=name, state=cyclone.RunState.COMPLETED)) == []


def test_get_run_takes_a_uuid_or_its_text_and_returns_none_for_an_unknown_run(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    run, _ = flaky_workflow(name).submit_once(engine, "k", 1)
    by_uuid = client.get_run(run.id)
    assert by_uuid is not None
    assert (by_uuid.id, by_uuid.workflow, by_uuid.key, by_uuid.state) == (
        run.id,
        name,
        "k",
        cyclone.RunState.RUNNING,
    )
    assert client.get_run(str(run.id)) == by_uuid
    assert client.get_run(uuid.uuid4()) is None
    assert client.get_run(str(uuid.uuid4())) is None


def test_list_jobs_lists_standalone_jobs_newest_first_with_filters(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    @cyclone.step(f"{name}.a")
    def a(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @cyclone.step(f"{name}.b")
    def b(ctx: cyclone.StepContext, n: int) -> int:
        return n

    flaky_workflow(name).submit(engine, 1)  # its step job is not standalone: never listed
    first = a.enqueue(engine, 1)
    second = b.enqueue(engine, 2, queue=f"{name}-q")
    third = a.enqueue(engine, 3, unique="u")
    cyclone.Worker(engine, steps=[a]).drain()

    assert [j.id for j in client.list_jobs()] == [third.id, second.id, first.id]
    assert [j.id for j in client.list_jobs(kind=f"{name}.a")] == [third.id, first.id]
    assert [j.id for j in client.list_jobs(queue=f"{name}-q")] == [second.id]
    assert [j.id for j in client.list_jobs(state=cyclone.JobState.AVAILABLE)] == [second.id]
    assert [j.id for j in client.list_jobs(state="completed")] == [third.id, first.id]
    page = client.list_jobs(limit=2)
    assert [j.id for j in client.list_jobs(after=page[-1])] == [first.id]


def test_get_job_returns_a_standalone_job_or_none(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    @cyclone.step(name)
    def a(ctx: cyclone.StepContext, n: int) -> int:
        return n

    job = a.enqueue(engine, 1, unique="u")
    status = client.get_job(job.id)
    assert status is not None
    assert (status.id, status.kind, status.key, status.state) == (
        job.id,
        name,
        "u",
        cyclone.JobState.AVAILABLE,
    )
    flaky = flaky_workflow(name)
    run = flaky.submit(engine, 1)
    start_runs(engine, flaky)
    with engine.connect() as c:
        step_job = c.execute(sa.select(jobs.c.id).where(jobs.c.run_id == run.id)).scalar_one()
    assert client.get_job(step_job) is None
    assert client.get_job(10**15) is None
    # Past bigint no job exists: None, not the driver's DataError (bigint out of range).
    assert client.get_job(2**63) is None
    assert client.get_job_detail(2**63) is None
    with pytest.raises(cyclone.NotFoundError):
        client.cancel_job(2**63)
    with pytest.raises(cyclone.NotFoundError):
        client.retry_job(-(2**63) - 1)
    with pytest.raises(TypeError, match="a job id is an int, not str"):
        client.get_job("1")  # type: ignore[arg-type]


def test_count_runs_returns_every_state_with_zeros(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    assert client.count_runs() == dict.fromkeys(cyclone.RunState, 0)
    wf = flaky_workflow(name)
    wf.submit(engine, 1)
    wf.submit(engine, 2)
    wf.submit(engine, -1)
    cyclone.Worker(engine, workflows=[wf]).drain()
    wf.submit(engine, 3)
    flaky_workflow(f"{name}-other").submit(engine, 4)
    assert client.count_runs(workflow=name) == {
        cyclone.RunState.RUNNING: 1,
        cyclone.RunState.COMPLETED: 2,
        cyclone.RunState.FAILED: 1,
        cyclone.RunState.CANCELLED: 0,
    }
    assert client.count_runs()[cyclone.RunState.RUNNING] == 2


def test_count_jobs_returns_every_state_with_zeros(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    assert client.count_jobs() == dict.fromkeys(cyclone.JobState, 0)

    @cyclone.step(name)
    def a(ctx: cyclone.StepContext, n: int) -> int:
        return n

    a.enqueue(engine, 1)
    cyclone.Worker(engine, steps=[a]).drain()
    a.enqueue(engine, 2, queue=f"{name}-q")
    flaky_workflow(name).submit(engine, 1)  # workflow steps count too
    assert client.count_jobs() == {
        **dict.fromkeys(cyclone.JobState, 0),
        cyclone.JobState.AVAILABLE: 2,
        cyclone.JobState.COMPLETED: 1,
    }
    assert client.count_jobs(queue=f"{name}-q") == {
        **dict.fromkeys(cyclone.JobState, 0),
        cyclone.JobState.AVAILABLE: 1,
    }


def test_a_listing_by_workflow_reads_the_listing_index(engine: sa.Engine, name: str) -> None:
    # The listing states the index's predicate as the same literal, so the planner can
    # match it (a parameter would not prove it, nor would IS NOT NULL on PostgreSQL 17).
    with engine.begin() as conn:
        insert = sa.text(
            "WITH d AS (INSERT INTO cyclone_definitions (id, workflow, graph)"
            " VALUES (gen_random_uuid(), :wf, '{}') RETURNING id) "
            "INSERT INTO cyclone_runs (workflow, input, definition, steps_remaining, created_at) "
            "SELECT :wf, to_jsonb(g), (SELECT id FROM d), 1, now() + g * interval '1 us' "
            "FROM generate_series(1, :n) g"
        )
        conn.execute(insert, {"wf": name, "n": 20})
        conn.execute(insert, {"wf": f"{name}-newer", "n": 5000})  # newer: the last to list
        conn.execute(sa.text("ANALYZE cyclone_runs"))
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        sent.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        assert len(cyclone.Client(engine).list_runs(workflow=name, limit=5)) == 5
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    statement, parameters = next((s, p) for s, p in sent if "FROM cyclone_runs" in s)
    with engine.connect() as conn:
        plan = conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars().all()
    assert any("ix_cyclone_runs_listing" in line for line in plan), plan
    with engine.begin() as conn:
        conn.execute(sa.delete(runs).where(runs.c.workflow.in_([name, f"{name}-newer"])))


def test_run_detail_reads_input_result_and_steps_in_order(engine: sa.Engine, name: str) -> None:
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name, output=Any)

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    @wf.result(after=[first])
    def second(ctx: cyclone.StepContext, value: Any) -> dict[str, Any]:
        return {"value": value, "first": ctx.output(first)}

    run, _ = wf.submit_once(engine, "k", {"n": 3})
    client = cyclone.Client(engine)
    pending = client.get_run_detail(run.id)
    assert pending is not None
    assert pending.result is None
    assert [(s.name, s.state.value, s.started_at, s.duration) for s in pending.steps] == [
        ("first", "available", None, None),
        ("second", "blocked", None, None),
    ]
    cyclone.Worker(engine, workflows=[wf]).drain()
    detail = client.get_run_detail(str(run.id))
    assert detail is not None
    assert detail.input == {"n": 3}
    assert detail.result_step == "second"
    assert detail.result == {"value": {"n": 3}, "first": 1}
    assert [s.state for s in detail.steps] == [cyclone.JobState.COMPLETED] * 2
    assert all(s.duration is not None and s.attempt == 1 for s in detail.steps)
    assert client.get_run_detail(uuid.uuid4()) is None


def test_list_runs_since_takes_an_aware_datetime_only(engine: sa.Engine) -> None:
    with pytest.raises(ValueError, match="aware datetime"):
        cyclone.Client(engine).list_runs(since=datetime(2026, 1, 1))
