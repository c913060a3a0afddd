"""Entry points of the worker processes the benchmark spawns (cyclone's and the raw loop's).

Each one connects and warms up, reports ``ready`` on its queue, then waits for the start
event, so process start-up never counts. Times are ``time.monotonic()``, which all
processes of one machine share.
"""

from __future__ import annotations

import json
import multiprocessing.synchronize
import time
from multiprocessing import Queue
from typing import Any

import psycopg
import sqlalchemy as sa

from bench import workloads


def _engine(url: str, pool_size: int = 8) -> sa.Engine:
    return sa.create_engine(url, pool_size=pool_size, max_overflow=8)


def _warm(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        conn.execute(sa.select(1))


def cyclone_drain(
    url: str,
    what: str,
    concurrency: int,
    start: multiprocessing.synchronize.Event,
    finish: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """Drain the pre-enqueued jobs of ``what`` ("jobs" or "workflow") with one Worker."""
    import cyclone

    engine = _engine(url, pool_size=concurrency + 2)
    if what == "jobs":
        worker = cyclone.Worker(
            engine, steps=[workloads.noop], concurrency=concurrency, sweep=False
        )
    else:
        worker = cyclone.Worker(
            engine, workflows=[workloads.three_step], concurrency=concurrency, sweep=False
        )
    _warm(engine)
    out.put(("ready", None))
    start.wait()
    t0 = time.monotonic()
    n = worker.drain()
    t1 = time.monotonic()
    out.put(("done", (t0, t1, n)))
    engine.dispose()


def raw_drain(
    url: str,
    batch: int,
    start: multiprocessing.synchronize.Event,
    finish: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """The raw limit: claim ``batch`` jobs with SKIP LOCKED, run them, mark them done."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        out.put(("ready", None))
        start.wait()
        t0 = time.monotonic()
        n = 0
        while True:
            rows = conn.execute(workloads.RAW_CLAIM, (batch,)).fetchall()
            if not rows:
                break
            for _id, args in rows:
                _noop(args)
            conn.execute(workloads.RAW_COMPLETE, ([r[0] for r in rows],))
            n += len(rows)
        t1 = time.monotonic()
    out.put(("done", (t0, t1, n)))


def _noop(args: Any) -> None:
    return None


def cyclone_serve(url: str, concurrency: int, out: Queue[Any]) -> None:
    """An idle cyclone worker for the ping workflow, until SIGTERM."""
    import cyclone

    engine = _engine(url, pool_size=concurrency + 2)
    worker = cyclone.Worker(engine, workflows=[workloads.ping], concurrency=concurrency)
    _warm(engine)
    out.put(("ready", None))
    worker.run()
    engine.dispose()


def raw_serve(url: str, stop: multiprocessing.synchronize.Event, out: Queue[Any]) -> None:
    """A minimal LISTEN/NOTIFY worker: woken by a NOTIFY, claims, runs, notifies done."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN raw_jobs_available")
        out.put(("ready", None))
        while not stop.is_set():
            while rows := conn.execute(workloads.RAW_CLAIM, (10,)).fetchall():
                for _id, args in rows:
                    _noop(args)
                conn.execute(workloads.RAW_COMPLETE_NOTIFY, ([r[0] for r in rows],)).fetchall()
            for _note in conn.notifies(timeout=0.5, stop_after=1):
                pass


def raw_ping(conn: psycopg.Connection[Any], i: int) -> float:
    """One raw submit → finished round trip on a connection that LISTENs raw_job_done."""
    t0 = time.perf_counter()
    job_id = conn.execute(workloads.RAW_ENQUEUE_NOTIFY, (json.dumps(i),)).fetchone()
    assert job_id is not None
    wanted = str(job_id[0])
    while True:
        got = [note.payload for note in conn.notifies(timeout=10.0, stop_after=1)]
        if not got:
            raise TimeoutError("the raw worker did not answer within 10 s")
        if wanted in got:
            break
    row = conn.execute("SELECT output FROM raw_jobs WHERE id = %s", (job_id[0],)).fetchone()
    assert row is not None
    assert row[0] == i
    return time.perf_counter() - t0
