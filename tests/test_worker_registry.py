"""The registry of running workers (``cyclone_workers``): a worker registers when it starts
serving, beats while idle, records its stop, leaves when it stops; the maintenance leader
removes a killed worker after ``rescue_after``; ``Client.list_workers``, ``cyclone
workers`` and the dashboard's workers page read it."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from markupsafe import escape
from werkzeug.test import Client as WebClient

import cyclone
from cyclone.dashboard import create_app
from tests.conftest import StatementCounter, wait_until
from tests.support import docs, processes, worker_proc
from tests.support.workers import (
    Background,
    job_rows,
    lease,
    spawn_worker,
    stop_all,
    waiting_advisory_locks,
)

FAST = {
    "heartbeat_interval": timedelta(milliseconds=50),
    "rescue_after": timedelta(seconds=5),
    "poll_interval": 0.1,
    "sweep": False,
}


def listed(engine: sa.Engine, worker_id: str) -> cyclone.WorkerStatus | None:
    return next((w for w in cyclone.Client(engine).list_workers() if w.id == worker_id), None)


@contextmanager
def serving(worker: cyclone.Worker) -> Iterator[cyclone.WorkerStatus]:
    """``worker.run()`` on a thread until the block ends; yields its row once it is listed."""
    background = Background(worker.run, name="test-registry-worker")
    try:
        yield wait_until(lambda: listed(worker.engine, worker.id), timeout=30)
    finally:
        worker.stop()
        background.join(30)
        worker.close()


def definitions(name: str) -> tuple[cyclone.Workflow[Any], cyclone.StandaloneStep[Any, Any]]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step()(lambda ctx, value: value)
    kind = cyclone.step(f"{name}.kind")(lambda ctx, value: value)
    return wf, kind


def test_a_worker_is_listed_with_its_options_while_it_serves_and_leaves_when_it_stops(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cyclone.worker")
    wf, kind = definitions(name)
    worker = cyclone.Worker(
        engine, workflows=[wf], steps=[kind], concurrency=3, queues={"b": 1, "a": 2}, **FAST
    )
    with serving(worker) as status:
        assert status.id == worker.id
        assert (status.host, status.pid) == (socket.gethostname(), os.getpid())
        assert (status.concurrency, status.queues) == (3, ["a", "b"])
        assert (status.workflows, status.steps) == ([name], [f"{name}.kind"])
        assert (status.version, status.stopping_at, status.running) == (
            cyclone.__version__,
            None,
            0,
        )
        assert status.started_at <= status.heartbeat_at <= status.read_at
    assert listed(engine, worker.id) is None
    assert "cyclone_workers" not in caplog.text  # deleted on the heartbeat's connection


def test_a_worker_serving_every_queue_is_listed_with_none(engine: sa.Engine, name: str) -> None:
    wf, _kind = definitions(name)
    with serving(cyclone.Worker(engine, workflows=[wf], **FAST)) as status:
        assert (status.queues, status.steps, status.concurrency) == (None, [], 4)


def test_an_idle_workers_heartbeat_moves(engine: sa.Engine, name: str) -> None:
    wf, _kind = definitions(name)
    with serving(cyclone.Worker(engine, workflows=[wf], **FAST)) as first:
        later = wait_until(
            lambda: (w := listed(engine, first.id)) and w.heartbeat_at > first.heartbeat_at and w,
            timeout=30,
        )
        assert later.running == 0
        assert later.started_at == first.started_at


def test_a_drain_registers_and_leaves(engine: sa.Engine, name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    seen: list[cyclone.WorkerStatus | None] = []

    @wf.step()
    def look(ctx: cyclone.StepContext, value: Any) -> None:
        seen.append(listed(engine, worker.id))

    wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], sweep=False)
    assert worker.drain() == 1
    [status] = seen
    assert status is not None
    assert status.running == 1  # the job running `look`, under the worker's id
    assert listed(engine, worker.id) is None
    worker.close()


def test_the_registry_costs_no_statement_per_job(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    """A drain of many jobs writes the row once and deletes it once, and its maintenance
    passes (its first and last, and one a second between, should the drain last) prune
    silent workers' rows: the claim loop sends nothing for it (the heartbeat, a minute
    here, does not fall within the drain)."""
    wf, _kind = definitions(name)
    for i in range(30):
        wf.submit(engine, i)
    worker = cyclone.Worker(
        engine,
        workflows=[wf],
        heartbeat_interval=timedelta(minutes=1),
        rescue_after=timedelta(minutes=5),
        sweep=False,
    )
    statements.reset()
    assert worker.drain() == 30
    worker.close()
    writes = (
        "INSERT INTO cyclone_workers",
        "UPDATE cyclone_workers",
        "DELETE FROM cyclone_workers",
    )
    touching = [
        s.lstrip().split()[0].upper()
        for s in statements.statements
        if s.lstrip().startswith(writes)
    ]
    pruned = [s for s in statements.statements if "cyclone_workers.heartbeat_at <" in s]
    assert (touching.count("INSERT"), touching.count("DELETE")) == (1, 1 + len(pruned)), touching
    assert 2 <= len(pruned) < 30, touching
    assert len(touching) == 2 + len(pruned)


def test_a_row_deleted_under_a_live_worker_is_written_again(engine: sa.Engine, name: str) -> None:
    """As when a leader pruned the row of a worker frozen past ``rescue_after`` that thawed."""
    wf, _kind = definitions(name)
    with serving(cyclone.Worker(engine, workflows=[wf], **FAST)) as status:
        with engine.begin() as conn:
            conn.execute(
                sa.text("DELETE FROM cyclone_workers WHERE worker_id = :id"), {"id": status.id}
            )
        again = wait_until(lambda: listed(engine, status.id), timeout=30)
        assert again.started_at > status.started_at
        assert again.workflows == [name]


@pytest.mark.processes
def test_a_worker_stopping_on_sigterm_records_it_while_it_waits_for_its_job(
    engine: sa.Engine, name: str
) -> None:
    lock = uuid.uuid4().int % 2**31
    wf = worker_proc.gated(name, lock)
    with engine.connect() as holder:
        holder.execute(sa.select(sa.func.pg_advisory_lock(lock)))
        holder.commit()
        run = wf.submit(engine, worker_proc.Item(n=1))
        proc = spawn_worker("serve", name, str(lock))
        try:
            wait_until(lambda: waiting_advisory_locks(engine, lock) == 1, timeout=30)
            status = wait_until(
                lambda: next(
                    (w for w in cyclone.Client(engine).list_workers() if w.pid == proc.pid), None
                ),
                timeout=30,
            )
            assert (status.running, status.concurrency, status.stopping_at) == (1, 1, None)
            proc.send_signal(signal.SIGTERM)
            stopping = wait_until(
                lambda: (w := listed(engine, status.id)) and w.stopping_at is not None and w,
                timeout=30,
            )
            assert stopping.running == 1  # it waits for its job, which waits for the lock
            assert proc.poll() is None
            holder.execute(sa.select(sa.func.pg_advisory_unlock(lock)))
            holder.commit()
            _out, err = proc.communicate(timeout=30)
        finally:
            stop_all([proc])
    assert proc.returncode == 0, err
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert listed(engine, status.id) is None  # a clean stop deletes its row


def heartbeat_backend(engine: sa.Engine) -> int | None:
    """The server process of the connection that recorded a worker's stop in its row:
    the heartbeat's (the one statement of cyclone setting ``stopping_at``)."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND query LIKE 'UPDATE cyclone_workers SET %' "
                "AND query LIKE '%stopping_at%'"
            )
        ).scalars()
        pids = list(found)
    assert len(pids) <= 1, pids
    return pids[0] if pids else None


def test_a_worker_whose_heartbeat_connection_broke_deletes_its_row_on_a_new_one_at_stop(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat's server process is terminated after it recorded the stop, while the
    worker waits for its job (its heartbeat a minute away, so no beat finds it broken
    first): the stop deletes the row on a new connection, not leaving it to the leader."""
    caplog.set_level(logging.INFO, logger="cyclone.worker")
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    release = threading.Event()

    @wf.step()
    def hold(ctx: cyclone.StepContext, value: Any) -> Any:
        assert release.wait(60)
        return value

    run = wf.submit(engine, 1)
    worker = cyclone.Worker(
        engine,
        workflows=[wf],
        heartbeat_interval=timedelta(minutes=1),
        rescue_after=timedelta(minutes=5),
        poll_interval=0.1,
        sweep=False,
    )
    background = Background(worker.run, name="test-registry-worker")
    try:
        wait_until(lambda: (w := listed(engine, worker.id)) and w.running == 1, timeout=30)
        worker.stop()
        wait_until(lambda: (w := listed(engine, worker.id)) and w.stopping_at, timeout=30)
        backend = wait_until(lambda: heartbeat_backend(engine), timeout=30)
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.pg_terminate_backend(backend))).scalar_one()
        wait_until(lambda: heartbeat_backend(engine) is None, timeout=30)
        assert listed(engine, worker.id) is not None
    finally:
        release.set()
        background.join(30)
        worker.close()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert listed(engine, worker.id) is None
    assert "deleted its row of cyclone_workers on a new connection (the heartbeat's failed:" in (
        caplog.text
    )


@pytest.mark.processes
def test_the_leader_removes_a_killed_worker_after_rescue_after(
    engine: sa.Engine, name: str, tmp_path: Path
) -> None:
    flag = tmp_path / "stuck"
    wf = worker_proc.crashy(name, flag)
    run = wf.submit(engine, worker_proc.Item(n=7))
    proc = spawn_worker("lead", name, str(flag))
    try:
        wait_until(flag.exists, timeout=30)
        status = wait_until(
            lambda: next(
                (w for w in cyclone.Client(engine).list_workers() if w.pid == proc.pid), None
            ),
            timeout=30,
        )
        wait_until(lambda: (w := listed(engine, status.id)) and w.running == 1, timeout=30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        stop_all([proc])
    last = listed(engine, status.id)
    assert last is not None  # a killed worker stays listed, its heartbeat still
    rescue_after = worker_proc.LEAD_RESCUE_AFTER
    leader = cyclone.Worker(
        engine,
        workflows=[wf],
        heartbeat_interval=timedelta(milliseconds=100),
        rescue_after=rescue_after,
        poll_interval=0.1,
        sweep=False,
    )
    with serving(leader):
        wait_until(lambda: listed(engine, status.id) is None, timeout=30)
        with engine.connect() as conn:
            now = conn.execute(sa.select(sa.func.now())).scalar_one()
        assert now - last.heartbeat_at >= rescue_after
        # The same pass handed its job back: it runs again, here.
        assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED


@pytest.mark.processes
def test_the_leader_judges_a_worker_and_its_jobs_by_the_workers_own_rescue_after(
    own_engine: sa.Engine, own_url: sa.URL, name: str, tmp_path: Path
) -> None:
    """A worker beating every 1.5 s that promised 4 s (``promise``), under a leader whose
    own ``rescue_after`` is 0.5 s: alive, silent three times the leader's between beats,
    it keeps its row and its job; killed, it loses both 4 s after its last beat, not
    sooner."""
    flag = tmp_path / "stuck"
    wf = worker_proc.crashy(name, flag)
    other: cyclone.Workflow[Any] = cyclone.Workflow(f"{name}-lead")
    other.step()(lambda ctx, value: value)
    lead = cyclone.Worker(
        own_engine,
        workflows=[other],
        heartbeat_interval=timedelta(milliseconds=100),
        rescue_after=timedelta(milliseconds=500),
        poll_interval=0.1,
        sweep=False,
    )
    with serving(lead):
        wait_until(lambda: (held := lease(own_engine)) and held[0] == lead.id, timeout=30)
        run = wf.submit(own_engine, worker_proc.Item(n=7))
        proc = spawn_worker(
            "promise", name, str(flag), database_url=own_url.render_as_string(hide_password=False)
        )
        try:
            wait_until(flag.exists, timeout=30)
            first = wait_until(
                lambda: next(
                    (w for w in cyclone.Client(own_engine).list_workers() if w.pid == proc.pid),
                    None,
                ),
                timeout=30,
            )
            assert first.rescue_after == worker_proc.PROMISE_RESCUE_AFTER
            wait_until(lambda: (w := listed(own_engine, first.id)) and w.running == 1, timeout=30)
            held_by = job_lease(own_engine, run.id)
            assert held_by[1] == first.id
            # Alive: silent for twice the leader's rescue_after (the leader passes every
            # third of a second meanwhile), then it beats again, its row never deleted
            # (a row deleted is written again with a new started_at) nor its job taken.
            silent = wait_until(
                lambda: (
                    (w := listed(own_engine, first.id))
                    and w.silent_for > 2 * lead.rescue_after
                    and w
                ),
                timeout=30,
            )
            beaten = wait_until(
                lambda: (
                    (w := listed(own_engine, first.id))
                    and w.heartbeat_at > silent.heartbeat_at
                    and w
                ),
                timeout=30,
            )
            assert beaten.started_at == first.started_at
            assert beaten.running == 1
            assert job_lease(own_engine, run.id) == held_by
            assert lease(own_engine) is not None
            assert lease(own_engine)[0] == lead.id  # type: ignore[index]
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            stop_all([proc])
        last = listed(own_engine, first.id)
        assert last is not None
        # Dead: removed, and its job handed back, once its own rescue_after has passed.
        wait_until(lambda: listed(own_engine, first.id) is None, timeout=30)
        with own_engine.connect() as conn:
            now = conn.execute(sa.select(sa.func.now())).scalar_one()
        assert now - last.heartbeat_at >= worker_proc.PROMISE_RESCUE_AFTER
        [row] = job_rows(own_engine, run.id).values()
        assert row.state == "available"
        assert [e["type"] for e in row.errors] == ["WorkerLost"]
        lost_at = datetime.fromisoformat(row.errors[0]["at"])
        assert lost_at - last.heartbeat_at >= worker_proc.PROMISE_RESCUE_AFTER - HEARTBEAT_SKEW
    # The step runs again here (its flag exists: it returns).
    assert cyclone.Worker(own_engine, workflows=[wf], sweep=False).drain() == 1
    assert run.status().state == cyclone.RunState.COMPLETED


HEARTBEAT_SKEW = timedelta(milliseconds=100)
"""The row and the jobs are beaten by two statements of one beat: the job's heartbeat,
the first, can precede the row's by this much."""


def job_lease(engine: sa.Engine, run_id: uuid.UUID) -> tuple[int, str]:
    """The lease and worker of the one job of a run."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.text("SELECT lease, worker_id FROM cyclone_jobs WHERE run_id = :id"), {"id": run_id}
        ).one()
    return int(found[0]), str(found[1])


def database_url(engine: sa.Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


@pytest.mark.processes
def test_the_cli_lists_the_workers_as_a_table_and_as_json(engine: sa.Engine, name: str) -> None:
    wf, kind = definitions(name)
    worker = cyclone.Worker(engine, workflows=[wf], steps=[kind], concurrency=2, **FAST)
    with serving(worker):
        command = [sys.executable, "-m", "cyclone", "workers", "--url", database_url(engine)]
        table = processes.run(command, capture_output=True, text=True, timeout=60)
        lines = processes.run([*command, "--json"], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == [
        "ID",
        "STARTED",
        "(UTC)",
        "HEARTBEAT",
        "(UTC)",
        "RUNNING",
        "QUEUES",
        "WORKFLOWS",
        "STEPS",
        "VERSION",
        "STOPPING",
        "(UTC)",
    ]
    [row] = [r.split() for r in rows if r.startswith(worker.id)]
    assert row[5:] == ["0/2", "all", name, f"{name}.kind", cyclone.__version__, "-"]
    assert lines.returncode == 0, lines.stderr
    records = [json.loads(line) for line in lines.stdout.splitlines()]
    [record] = [r for r in records if r["id"] == worker.id]
    assert record["host"] == socket.gethostname()
    assert record["pid"] == os.getpid()
    assert (record["concurrency"], record["queues"], record["running"]) == (2, None, 0)
    assert (record["workflows"], record["steps"]) == ([name], [f"{name}.kind"])
    assert record["stopping_at"] is None
    assert record["started_at"].endswith("Z")


@pytest.mark.processes
def test_the_cli_fails_in_one_line_on_a_database_it_cannot_reach() -> None:
    done = processes.run(
        [sys.executable, "-m", "cyclone", "workers", "--url", "postgresql://x@127.0.0.1:1/db"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert done.stderr.startswith("cyclone: cannot connect to PostgreSQL at 127.0.0.1:1")
    assert len(done.stderr.splitlines()) == 1


def test_the_dashboard_lists_the_workers_escaped_and_is_in_the_navigation(
    engine: sa.Engine, name: str
) -> None:
    wf, kind = definitions(name)
    odd = f"<b>{name}</b>:1:deadbeef"
    with engine.begin() as conn:  # a row as another host might write it, markup in it
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_workers (worker_id, host, pid, concurrency, queues, "
                "workflows, steps, version) VALUES (:id, :host, 1, 1, ARRAY['<q>'], "
                "ARRAY[]::text[], ARRAY[]::text[], '0.0.1')"
            ),
            {"id": odd, "host": f"<b>{name}</b>"},
        )
    web = WebClient(create_app(engine))
    try:
        assert 'href="/workers"' in web.get("/").get_data(as_text=True)
        worker = cyclone.Worker(engine, workflows=[wf], steps=[kind], queues={"mail": 1}, **FAST)
        with serving(worker):
            answer = web.get("/workers")
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM cyclone_workers WHERE worker_id = :id"), {"id": odd})
    assert answer.status_code == 200
    page = answer.get_data(as_text=True)
    start = page.index(f">{worker.id}<")
    row = page[start : page.index("</tr>", start)]
    assert f'href="/runs?workflow={name}"' in row
    assert f'href="/jobs?kind={name}.kind"' in row
    assert "0 / 4" in row
    assert ">mail<" in row
    assert "running" in row
    assert str(escape(odd)) in page
    assert str(escape("<q>")) in page
    assert f"<b>{name}</b>" not in page
    assert "<q>" not in page


def test_the_operations_block_prints_the_running_workers(
    engine: sa.Engine, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The block of docs/operations.md's "## Which workers are alive", as written."""
    wf, _kind = definitions(name)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=2, **FAST)
    with serving(worker):
        namespace = {"client": cyclone.Client(engine), "cyclone": cyclone}
        for block in docs.blocks("docs/operations.md", "## Which workers are alive"):
            exec(compile(block, "docs/operations.md", "exec"), namespace)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(worker.id)]
    assert len(printed) == 1
    assert printed[0].startswith(f"{worker.id} running 0/2 jobs ")
