"""Entry points of the processes the benchmark spawns: workers (cyclone's and the raw
loop's) and submitters.

Each one connects and warms up, reports ``ready`` on its queue, then waits for the start
event, so process start-up never counts. Times are ``time.monotonic()``, which all
processes of one machine share. They are module-level so that spawned processes can
import them.
"""

from __future__ import annotations

import json
import logging
import multiprocessing.synchronize
import threading
import time
from multiprocessing import Queue
from typing import Any

import psycopg
import sqlalchemy as sa

from bench import measure, workloads


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


# --- figures g, i and j ------------------------------------------------------------------


def submitter(
    url: str,
    dsn: str,
    side: str,
    prefix: str,
    count: int,
    start: multiprocessing.synchronize.Event,
    finish: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """``count`` new-key submits as fast as it can: ``side`` "cyclone" (``submit_once``),
    "raw" (the raw insert) or "raw-notify" (the raw insert with cyclone's NOTIFY).

    Its connections stay open until ``finish``, so that their backends' CPU can be read.
    """
    engine = sa.create_engine(url, pool_size=2)
    conn = psycopg.connect(dsn, autocommit=True)
    wf = workloads.one_step
    if side.startswith("raw"):
        statement = (
            workloads.RAW_INSERT_ONCE_NOTIFY if side == "raw-notify" else workloads.RAW_INSERT_ONCE
        )

        def one(i: int) -> None:
            conn.execute(
                statement, ("bench_one", f"{prefix}-{i}", json.dumps(workloads.payload(i)))
            ).fetchone()
    else:

        def one(i: int) -> None:
            wf.submit_once(engine, f"{prefix}-{i}", workloads.payload(i))

    for i in range(20):
        one(-1 - i)
    out.put(("ready", None))
    start.wait()
    t0, cpu0 = time.monotonic(), time.process_time()
    for i in range(count):
        one(i)
    t1, cpu1 = time.monotonic(), time.process_time()
    out.put(("done", (t0, t1, count, cpu1 - cpu0)))
    finish.wait(60)
    conn.close()
    engine.dispose()


def paced_submitter(
    url: str,
    prefix: str,
    rate: float,
    seconds: float,
    start: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """New-key ``submit_once`` calls at ``rate`` per second for ``seconds`` (fewer if it lags)."""
    engine = sa.create_engine(url, pool_size=2)
    wf = workloads.one_step
    _warm(engine)
    out.put(("ready", None))
    start.wait()
    t0 = time.monotonic()
    n = 0
    while True:
        now = time.monotonic()
        if now - t0 >= seconds:
            break
        due = t0 + n / rate
        if due > now:
            time.sleep(due - now)
        wf.submit_once(engine, f"{prefix}-{n}", workloads.payload(n))
        n += 1
    out.put(("done", (t0, time.monotonic(), n)))
    engine.dispose()


def serving_worker(
    url: str,
    concurrency: int,
    start: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """A ``Worker.run()`` of the 1-step workflow until ``stop`` is set."""
    import cyclone

    engine = sa.create_engine(url, pool_size=concurrency + 2)
    worker = cyclone.Worker(
        engine, workflows=[workloads.one_step], concurrency=concurrency, sweep=False
    )
    out.put(("ready", None))
    start.wait()

    def stopper() -> None:
        stop.wait()
        worker.stop()

    threading.Thread(target=stopper, daemon=True).start()
    worker.run()
    out.put(("done", None))
    engine.dispose()


def memory_worker(url: str, concurrency: int, commands: Queue[Any], out: Queue[Any]) -> None:
    """One Worker that drains on each command and reports its RSS after each drain."""
    import cyclone

    quiet = logging.getLogger("cyclone")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    engine = sa.create_engine(url, pool_size=concurrency + 2)
    worker = cyclone.Worker(
        engine, steps=[workloads.noop, workloads.fail], concurrency=concurrency, sweep=False
    )
    out.put(("ready", measure.rss_mb()))
    while commands.get() == "drain":
        n = worker.drain()
        out.put(("rss", (n, measure.rss_mb())))
    engine.dispose()
