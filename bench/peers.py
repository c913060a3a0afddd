"""cyclone beside the Python libraries a user would pick instead, on the same figures.

Run from the repository root (never from the test suite)::

    .venv/bin/pip install -e '.[bench,bench-peers]'
    .venv/bin/python -m bench.peers                  # N = 2,000, 30 pings
    .venv/bin/python -m bench.peers --quick          # small N, a smoke run
    .venv/bin/python -m bench.peers --only dbos,raw  # some systems only

Four figures, each for the raw psycopg baseline, cyclone and every peer, in one run
against one server: (1) new keys submitted one at a time through the library's
deduplication feature, (2) re-submitting existing keys, (3) draining pre-enqueued no-op
jobs with the library's worker and its defaults, (4) submit -> finished latency with an
idle worker. Each system gets a throwaway database per figure, with its schema installed
through its own documented command or API. oban (Python >= 3.12) runs in a separate
interpreter when this one cannot import it (``--oban-python``). The peers are imported
lazily, so that this module type-checks and imports without them.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

if __package__ in (None, ""):  # run as ``python bench/peers.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

import cyclone
from bench import procs, workloads
from bench.run import (
    DEFAULT_URL,
    RESULTS,
    ROOT,
    conninfo,
    drop_database,
    git_describe,
    percentile,
)

POLL = 0.002
"""Seconds between two status reads when a client waits for a peer's job to finish."""
CHUNKS = 10
WARMUP = 20
DRAIN_BUDGET = 30.0
"""Seconds a drain may take; a slower worker is rated on what it finished by then."""
CYCLONE_CONCURRENCY = 4  # cyclone.Worker's default
OBAN_QUEUE_LIMIT = 10  # oban has no default queue: the limit of its documentation's examples


def _imp(name: str) -> Any:
    """A peer's module, imported only when its figures run (the core venv lacks them)."""
    return importlib.import_module(name)


def _key(i: int) -> str:
    return f"key-{i}"


# --- the systems ------------------------------------------------------------------------------


class System:
    """One library on the four figures. Sync by default; ``AsyncSystem`` for asyncio ones."""

    name: ClassVar[str] = ""
    module: ClassVar[str] = ""
    """What must be importable for the figures, comma-separated (empty: nothing more)."""
    dedup: ClassVar[str] = ""
    """The deduplication feature figures 1 and 2 use, for the table."""
    no_dedup: ClassVar[str] = ""
    """Why figures 1 and 2 are n/a (empty: they are measured)."""
    only: ClassVar[str] = ""
    """A reference row measured on these figures only (empty: all four)."""
    count_sql: ClassVar[str] = ""
    """How many jobs/runs the database holds (checks that duplicates added none)."""
    done_sql: ClassVar[str] = ""
    """How many jobs/runs finished (drain progress)."""

    def __init__(self, url: URL) -> None:
        self.url = url
        self.sa_url = url.render_as_string(hide_password=False)
        self.dsn = conninfo(url)

    @classmethod
    def missing(cls) -> str:
        """Why this system cannot run in this interpreter ('' if it can)."""
        if not cls.module:
            return ""
        try:
            for module in cls.module.split(","):
                _imp(module)
        except ImportError as exc:
            return f"not importable here ({exc}); pip install -e '.[bench-peers]'"
        return ""

    def sql(self, statement: str) -> int:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(statement).fetchone()
        return int(row[0]) if row else 0

    def analyze(self) -> None:
        """What autovacuum's ANALYZE would do after a bulk load (it is off on the bench server)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("ANALYZE")

    # to implement
    def install(self) -> None:
        raise NotImplementedError

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def new(self, idx: range) -> None:
        """Submit ``_key(i)`` for each i, one call at a time, each one new."""
        raise NotImplementedError

    def dup(self, idx: range) -> None:
        """Submit ``_key(i)`` again for each i; each call must be deduplicated."""
        raise NotImplementedError

    def preload(self, n: int) -> None:
        """Enqueue n no-op jobs through the library (untimed)."""
        raise NotImplementedError

    def ping(self, i: int) -> float:
        """Submit one no-op job and wait until it is finished; seconds."""
        raise NotImplementedError

    def drain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        """In a worker process: call ``ready`` (returns at the start signal), drain, (t0, t1)."""
        raise NotImplementedError

    def serve(self) -> None:
        """In a worker process: an idle worker with the library's defaults, until SIGTERM."""
        raise NotImplementedError

    def spawn_drain(self, mp: Any, n: int, start: Any, out: Any) -> Any:
        return mp.Process(target=_drain_child, args=(self.name, self.sa_url, n, start, out))

    def spawn_serve(self, mp: Any, out: Any) -> Any:
        return mp.Process(target=_serve_child, args=(self.name, self.sa_url, out))

    def wait_done(self, n: int) -> int:
        """Poll ``done_sql`` until it counts n or DRAIN_BUDGET is spent; the count.

        For workers that have no drain mode of their own. The 20 ms poll adds at most
        that to a drain that lasts seconds.
        """
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            deadline = time.monotonic() + DRAIN_BUDGET
            while True:
                row = conn.execute(self.done_sql).fetchone()
                done = int(row[0]) if row else 0
                if done >= n or time.monotonic() > deadline:
                    return done
                time.sleep(0.02)


class AsyncSystem(System):
    """An asyncio library, driven with one ``asyncio.Runner`` (``asyncio.run`` per chunk)."""

    runner: asyncio.Runner

    def open(self) -> None:
        self.runner = asyncio.Runner()
        self.runner.run(self.aopen())

    def close(self) -> None:
        try:
            self.runner.run(self.aclose())
        finally:
            self.runner.close()

    def install(self) -> None:
        asyncio.run(self.ainstall())

    def new(self, idx: range) -> None:
        self.runner.run(self.anew(idx))

    def dup(self, idx: range) -> None:
        self.runner.run(self.adup(idx))

    def preload(self, n: int) -> None:
        self.runner.run(self.apreload(n))

    def ping(self, i: int) -> float:
        return self.runner.run(self.aping(i))

    def drain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        return asyncio.run(self.adrain(n, ready))

    def serve(self) -> None:
        asyncio.run(self.aserve())

    async def ainstall(self) -> None:
        raise NotImplementedError

    async def aopen(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def anew(self, idx: range) -> None:
        raise NotImplementedError

    async def adup(self, idx: range) -> None:
        raise NotImplementedError

    async def apreload(self, n: int) -> None:
        raise NotImplementedError

    async def aping(self, i: int) -> float:
        raise NotImplementedError

    async def adrain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        raise NotImplementedError

    async def aserve(self) -> None:
        raise NotImplementedError

    async def await_done(self, n: int) -> int:
        return await asyncio.to_thread(self.wait_done, n)


class Raw(System):
    name = "raw"
    dedup = "INSERT ... ON CONFLICT DO NOTHING on a unique index"
    count_sql = "SELECT count(*) FROM raw_runs"
    done_sql = "SELECT count(*) FROM raw_jobs WHERE state = 'completed'"

    def install(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(workloads.RAW_DDL)

    def open(self) -> None:
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute("LISTEN raw_job_done")

    def close(self) -> None:
        self.conn.close()

    def new(self, idx: range) -> None:
        for i in idx:
            row = self.conn.execute(
                workloads.RAW_INSERT_ONCE,
                ("bench_one", _key(i), json.dumps(workloads.payload(i))),
            ).fetchone()
            assert row is not None

    def dup(self, idx: range) -> None:
        for i in idx:
            row = self.conn.execute(
                workloads.RAW_INSERT_OR_SELECT,
                {"wf": "bench_one", "key": _key(i), "input": json.dumps(workloads.payload(i))},
            ).fetchone()
            assert row is not None
            assert row[1:] == (False, True)

    def preload(self, n: int) -> None:
        self.conn.execute(
            "INSERT INTO raw_jobs (kind, args) "
            "SELECT 'noop', to_jsonb(g) FROM generate_series(1, %s) g",
            (n,),
        )

    def ping(self, i: int) -> float:
        return procs.raw_ping(self.conn, i)

    def spawn_drain(self, mp: Any, n: int, start: Any, out: Any) -> Any:
        self._finish = mp.Event()  # procs' drains take one; kept alive for the child
        return mp.Process(target=procs.raw_drain, args=(self.dsn, 10, start, self._finish, out))

    def spawn_serve(self, mp: Any, out: Any) -> Any:
        self._stop = mp.Event()
        return mp.Process(target=procs.raw_serve, args=(self.dsn, self._stop, out))


class Cyclone(System):
    name = "cyclone"
    dedup = "wf.submit_once(engine, key, input) -> (run, created)"
    count_sql = "SELECT count(*) FROM cyclone_runs"
    done_sql = "SELECT count(*) FROM cyclone_jobs WHERE state = 'completed'"

    def install(self) -> None:
        engine = sa.create_engine(self.url, poolclass=sa.NullPool)
        cyclone.upgrade(engine)
        engine.dispose()

    def open(self) -> None:
        self.engine = sa.create_engine(self.url, pool_size=5, max_overflow=5)

    def close(self) -> None:
        self.engine.dispose()

    def new(self, idx: range) -> None:
        for i in idx:
            _run, created = workloads.one_step.submit_once(
                self.engine, _key(i), workloads.payload(i)
            )
            assert created

    def dup(self, idx: range) -> None:
        for i in idx:
            _run, created = workloads.one_step.submit_once(
                self.engine, _key(i), workloads.payload(i)
            )
            assert not created

    def preload(self, n: int) -> None:
        for i in range(n):
            workloads.noop.enqueue(self.engine, i)

    def ping(self, i: int) -> float:
        t0 = time.perf_counter()
        run, _created = workloads.ping.submit_once(self.engine, f"ping-{i}", i)
        value = run.result(timeout=30)
        elapsed = time.perf_counter() - t0
        assert value == i
        return elapsed

    def spawn_drain(self, mp: Any, n: int, start: Any, out: Any) -> Any:
        self._finish = mp.Event()  # procs' drains take one; kept alive for the child
        return mp.Process(
            target=procs.cyclone_drain,
            args=(self.sa_url, "jobs", CYCLONE_CONCURRENCY, start, self._finish, out),
        )

    def spawn_serve(self, mp: Any, out: Any) -> Any:
        return mp.Process(target=procs.cyclone_serve, args=(self.sa_url, CYCLONE_CONCURRENCY, out))


class Procrastinate(System):
    name = "procrastinate"
    module = "procrastinate"
    dedup = "task.configure(queueing_lock=key).defer(**input); AlreadyEnqueued on a duplicate"
    count_sql = "SELECT count(*) FROM procrastinate_jobs"
    done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    def _app(self, *, sync: bool) -> tuple[Any, Any]:
        p = _imp("procrastinate")
        connector = (
            p.SyncPsycopgConnector(conninfo=self.dsn)
            if sync
            else p.PsycopgConnector(conninfo=self.dsn)
        )
        app = p.App(connector=connector)
        task = app.task(name="bench_noop")(workloads.procrastinate_noop)
        return app, task

    def install(self) -> None:
        app, _task = self._app(sync=True)
        with app.open():
            app.schema_manager.apply_schema()

    def open(self) -> None:
        self.app, self.task = self._app(sync=True)
        self.app.open()
        self.already = _imp("procrastinate.exceptions").AlreadyEnqueued
        self.succeeded = _imp("procrastinate.jobs").Status.SUCCEEDED

    def close(self) -> None:
        self.app.close()

    def new(self, idx: range) -> None:
        for i in idx:
            self.task.configure(queueing_lock=_key(i)).defer(**workloads.payload(i))

    def dup(self, idx: range) -> None:
        for i in idx:
            try:
                self.task.configure(queueing_lock=_key(i)).defer(**workloads.payload(i))
            except self.already:
                continue
            raise AssertionError("procrastinate accepted a duplicate queueing_lock")

    def preload(self, n: int) -> None:
        for i in range(n):
            self.task.defer(value=i)

    def ping(self, i: int) -> float:
        t0 = time.perf_counter()
        job_id = self.task.defer(value=i)
        while self.app.job_manager.get_job_status(job_id) != self.succeeded:
            time.sleep(POLL)
        return time.perf_counter() - t0

    def drain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        app, _task = self._app(sync=False)
        ready()
        t0 = time.monotonic()
        app.run_worker(wait=False)  # defaults otherwise; returns once the queue is empty
        t1 = time.monotonic()
        return t0, t1, self.sql(self.done_sql)

    def serve(self) -> None:
        app, _task = self._app(sync=False)
        app.run_worker()


class Dbos(System):
    name = "dbos"
    module = "dbos"
    dedup = (
        "DBOSClient.enqueue({workflow_id: key, ...}, input); "
        "a used ID returns the existing workflow's handle"
    )
    count_sql = "SELECT count(*) FROM dbos.workflow_status"
    done_sql = "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
    queue = "bench"

    def _options(self, workflow_id: str) -> dict[str, str]:
        return {"queue_name": self.queue, "workflow_name": "bench_noop", "workflow_id": workflow_id}

    def install(self) -> None:
        exe = Path(sys.executable).parent / "dbos"
        cmd = str(exe) if exe.exists() else (shutil.which("dbos") or "dbos")
        subprocess.run([cmd, "migrate", "-s", self.dsn], check=True, capture_output=True)

    def open(self) -> None:
        self.client = _imp("dbos").DBOSClient(system_database_url=self.dsn)

    def close(self) -> None:
        self.client.destroy()

    def new(self, idx: range) -> None:
        for i in idx:
            handle = self.client.enqueue(self._options(_key(i)), workloads.payload(i))
            assert handle.workflow_id == _key(i)

    def dup(self, idx: range) -> None:
        for i in idx:
            handle = self.client.enqueue(self._options(_key(i)), workloads.payload(i))
            assert handle.workflow_id == _key(i)

    def preload(self, n: int) -> None:
        for i in range(n):
            self.client.enqueue(self._options(f"job-{i}"), i)

    def ping(self, i: int) -> float:
        t0 = time.perf_counter()
        handle = self.client.enqueue(self._options(f"ping-{i}"), i)
        handle.get_result(polling_interval_sec=POLL)
        return time.perf_counter() - t0

    def _launchable(self) -> Any:
        dbos = _imp("dbos")
        dbos.DBOS(config={"name": "cyclone-bench", "system_database_url": self.dsn})
        dbos.DBOS.workflow(name="bench_noop")(workloads.dbos_noop)
        return dbos.DBOS

    def drain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        dbos = self._launchable()
        ready()
        t0 = time.monotonic()
        dbos.launch()
        dbos.register_queue(self.queue)  # defaults: no limits, polled every second
        done = self.wait_done(n)
        t1 = time.monotonic()
        dbos.destroy()
        return t0, t1, done

    def serve(self) -> None:
        dbos = self._launchable()
        dbos.launch()
        dbos.register_queue(self.queue)
        while True:
            time.sleep(3600)


class PgQueuer(AsyncSystem):
    name = "pgqueuer"
    module = "pgqueuer,asyncpg"
    dedup = "Queries.enqueue(entrypoint, payload, dedupe_key=key); DuplicateJobError on a duplicate"
    count_sql = "SELECT count(*) FROM pgqueuer"
    done_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"

    async def _connect(self) -> tuple[Any, Any]:
        # asyncpg, the driver of PgQueuer's quickstart: with its psycopg driver the
        # listener holds the one connection and every query waited ~1 s behind it here.
        conn = await _imp("asyncpg").connect(self.dsn)
        driver = _imp("pgqueuer.db").AsyncpgDriver(conn)
        return conn, driver

    async def ainstall(self) -> None:
        conn, driver = await self._connect()
        await _imp("pgqueuer.queries").Queries(driver).install()
        await conn.close()

    async def aopen(self) -> None:
        self.conn, driver = await self._connect()
        self.queries = _imp("pgqueuer.queries").Queries(driver)
        self.duplicate = _imp("pgqueuer.errors").DuplicateJobError

    async def aclose(self) -> None:
        await self.conn.close()

    async def anew(self, idx: range) -> None:
        for i in idx:
            body = json.dumps(workloads.payload(i)).encode()
            await self.queries.enqueue("bench_noop", body, dedupe_key=_key(i))

    async def adup(self, idx: range) -> None:
        for i in idx:
            body = json.dumps(workloads.payload(i)).encode()
            try:
                await self.queries.enqueue("bench_noop", body, dedupe_key=_key(i))
            except self.duplicate:
                continue
            raise AssertionError("pgqueuer accepted a duplicate dedupe_key")

    async def apreload(self, n: int) -> None:
        for i in range(n):
            await self.queries.enqueue("bench_noop", str(i).encode())

    async def aping(self, i: int) -> float:
        t0 = time.perf_counter()
        (job_id,) = await self.queries.enqueue("bench_noop", str(i).encode())
        while True:
            got = await self.queries.job_status([job_id])
            if got and got[0][1] == "successful":
                break
            await asyncio.sleep(POLL)
        return time.perf_counter() - t0

    async def _pgq(self) -> tuple[Any, Any]:
        conn, driver = await self._connect()
        pgq = _imp("pgqueuer").PgQueuer(driver)
        pgq.entrypoint("bench_noop")(workloads.pgqueuer_noop)
        return conn, pgq

    async def adrain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        conn, pgq = await self._pgq()
        ready()
        t0 = time.monotonic()
        await pgq.run(mode=_imp("pgqueuer.types").QueueExecutionMode.drain)
        t1 = time.monotonic()
        await conn.close()
        return t0, t1, n - self.sql("SELECT count(*) FROM pgqueuer")  # done jobs leave it

    async def aserve(self) -> None:
        _conn, pgq = await self._pgq()
        await pgq.run()


class Chancy(AsyncSystem):
    name = "chancy"
    module = "chancy"
    dedup = "Chancy.push(Job.from_func(f).with_unique_key(key)); returns the holder's reference"
    count_sql = "SELECT count(*) FROM chancy_jobs"
    done_sql = "SELECT count(*) FROM chancy_jobs WHERE state = 'succeeded'"

    def _job(self, **kwargs: Any) -> Any:
        return _imp("chancy").Job.from_func(workloads.chancy_noop).with_kwargs(**kwargs)

    queue_options: ClassVar[dict[str, Any]] = {}

    async def ainstall(self) -> None:
        chancy = _imp("chancy")
        async with chancy.Chancy(self.dsn) as app:
            await app.migrate()
            await app.declare(chancy.Queue("default", **self.queue_options))

    async def aopen(self) -> None:
        self.app = _imp("chancy").Chancy(self.dsn)
        await self.app.__aenter__()

    async def aclose(self) -> None:
        await self.app.__aexit__(None, None, None)

    async def anew(self, idx: range) -> None:
        for i in idx:
            await self.app.push(self._job(**workloads.payload(i)).with_unique_key(_key(i)))

    async def adup(self, idx: range) -> None:
        for i in idx:
            await self.app.push(self._job(**workloads.payload(i)).with_unique_key(_key(i)))

    async def apreload(self, n: int) -> None:
        for i in range(n):
            await self.app.push(self._job(value=i))

    async def aping(self, i: int) -> float:
        t0 = time.perf_counter()
        ref = await self.app.push(self._job(value=i))
        job = await self.app.wait_for_job(ref, interval=POLL)
        elapsed = time.perf_counter() - t0
        assert job is not None
        assert job.state == job.State.SUCCEEDED
        return elapsed

    async def adrain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        chancy = _imp("chancy")
        async with chancy.Chancy(self.dsn) as app:
            worker = chancy.Worker(app)
            ready()
            t0 = time.monotonic()
            await worker.start()
            done = await self.await_done(n)
            t1 = time.monotonic()
            await worker.stop()
        return t0, t1, done

    async def aserve(self) -> None:
        chancy = _imp("chancy")
        async with chancy.Chancy(self.dsn) as app, chancy.Worker(app) as worker:
            await worker.wait_for_shutdown()


class ChancyEager(Chancy):
    """Reference row: Chancy's queue option for continuously available jobs."""

    name = "chancy-eager"
    only = "3"
    queue_options: ClassVar[dict[str, Any]] = {"eager_polling": True}


class Oban(AsyncSystem):
    name = "oban"
    module = "oban"
    no_dedup = "unique jobs are an Oban Pro (paid) feature; open-source oban has none"
    count_sql = "SELECT count(*) FROM oban_jobs"
    done_sql = "SELECT count(*) FROM oban_jobs WHERE state = 'completed'"

    def _worker(self) -> Any:
        return _imp("oban").job(queue="default")(workloads.oban_noop)

    async def ainstall(self) -> None:
        oban = _imp("oban")
        pool = await oban.Oban.create_pool(self.dsn)
        await _imp("oban.schema").install(pool)
        await pool.close()

    async def aopen(self) -> None:
        oban = _imp("oban")
        self.pool = await oban.Oban.create_pool(self.dsn)
        self.oban = oban.Oban(pool=self.pool)  # client mode: no queues
        await self.oban.start()
        self.noop = self._worker()

    async def aclose(self) -> None:
        await self.oban.stop()
        await self.pool.close()

    async def apreload(self, n: int) -> None:
        for i in range(n):
            await self.oban.enqueue(self.noop.new(value=i))

    async def aping(self, i: int) -> float:
        t0 = time.perf_counter()
        job = await self.oban.enqueue(self.noop.new(value=i))
        while True:
            got = await self.oban.get_job(job.id)
            if got is not None and str(getattr(got.state, "value", got.state)) == "completed":
                break
            await asyncio.sleep(POLL)
        return time.perf_counter() - t0

    async def _server(self) -> tuple[Any, Any]:
        oban = _imp("oban")
        pool = await oban.Oban.create_pool(self.dsn)
        self._worker()
        return pool, oban.Oban(pool=pool, queues={"default": OBAN_QUEUE_LIMIT})

    async def adrain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        pool, server = await self._server()
        ready()
        t0 = time.monotonic()
        await server.start()
        done = await self.await_done(n)
        t1 = time.monotonic()
        await server.stop()
        await pool.close()
        return t0, t1, done

    async def aserve(self) -> None:
        _pool, server = await self._server()
        await server.start()
        await asyncio.Event().wait()


SYSTEMS: dict[str, type[System]] = {
    cls.name: cls
    for cls in (Raw, Cyclone, Procrastinate, Dbos, PgQueuer, Chancy, ChancyEager, Oban)
}


# --- worker processes -------------------------------------------------------------------------


def _drain_child(name: str, url: str, n: int, start: Any, out: Any) -> None:
    system = SYSTEMS[name](make_url(url))

    def ready() -> None:
        out.put(("ready", None))
        start.wait()

    out.put(("done", system.drain(n, ready)))


def _serve_child(name: str, url: str, out: Any) -> None:
    system = SYSTEMS[name](make_url(url))
    out.put(("ready", None))
    system.serve()


# --- the figures ------------------------------------------------------------------------------


@dataclass
class Sizes:
    new_keys: int = 2_000
    duplicates: int = 1_000
    jobs: int = 2_000
    tries: int = 30


def create_database(admin: URL, name: str) -> URL:
    """A throwaway database named after the system (as ``bench.run.create_database``)."""
    db = f"cyclone_peers_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(conninfo(admin), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    return admin.set(database=db)


@contextmanager
def databases(admin: URL, names: Sequence[str]) -> Iterator[dict[str, System]]:
    """A fresh database per system, its schema installed; all dropped at the end."""
    made: dict[str, System] = {}
    try:
        for name in names:
            system = SYSTEMS[name](create_database(admin, name))
            made[name] = system
            system.install()
        yield made
    finally:
        for system in made.values():
            drop_database(admin, system.url)


def fig_submit(admin: URL, names: Sequence[str], sizes: Sizes) -> dict[str, Any]:
    """Figures 1 and 2, every system taking turns (CHUNKS turns of n / CHUNKS calls each)."""
    names = [n for n in names if not SYSTEMS[n].no_dedup and not SYSTEMS[n].only]
    n, dups = sizes.new_keys, min(sizes.duplicates, sizes.new_keys)
    result: dict[str, Any] = {}
    with databases(admin, names) as systems:
        for s in systems.values():
            s.open()
        try:
            for s in systems.values():  # warm-up, keys above the timed ones
                s.new(range(n, n + WARMUP))
                s.dup(range(n, n + WARMUP))
            new_t = dict.fromkeys(systems, 0.0)
            for chunk in range(CHUNKS):
                idx = range(n * chunk // CHUNKS, n * (chunk + 1) // CHUNKS)
                for name, s in systems.items():
                    t0 = time.perf_counter()
                    s.new(idx)
                    new_t[name] += time.perf_counter() - t0
            dup_t = dict.fromkeys(systems, 0.0)
            for chunk in range(CHUNKS):
                idx = range(dups * chunk // CHUNKS, dups * (chunk + 1) // CHUNKS)
                for name, s in systems.items():
                    t0 = time.perf_counter()
                    s.dup(idx)
                    dup_t[name] += time.perf_counter() - t0
        finally:
            for s in systems.values():
                s.close()
        for name, s in systems.items():
            rows = s.sql(s.count_sql)
            if rows != n + WARMUP:
                print(f"  warning: {name} holds {rows} rows for {n + WARMUP} keys", file=sys.stderr)
            result[name] = {
                "new_per_s": n / new_t[name],
                "dup_us": 1e6 * dup_t[name] / dups,
                "rows": rows,
            }
    return result


def fig_drain(admin: URL, names: Sequence[str], sizes: Sizes) -> dict[str, Any]:
    """Figure 3: n pre-enqueued no-op jobs, drained by one worker process with its defaults."""
    mp = multiprocessing.get_context("spawn")
    result: dict[str, Any] = {}
    for name in names:
        with databases(admin, [name]) as systems:
            s = systems[name]
            s.open()
            try:
                s.preload(sizes.jobs)
            finally:
                s.close()
            s.analyze()
            start = mp.Event()
            out: Any = mp.Queue()
            proc = s.spawn_drain(mp, sizes.jobs, start, out)
            proc.start()
            try:
                kind, _ = out.get(timeout=120)
                assert kind == "ready"
                start.set()
                kind, (t0, t1, done) = out.get(timeout=600)
            finally:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
            result[name] = {"jobs_per_s": done / (t1 - t0), "done": done, "of": sizes.jobs}
            print(f"  {name}: {done} of {sizes.jobs} jobs in {t1 - t0:.2f} s", flush=True)
    return result


def fig_latency(admin: URL, names: Sequence[str], sizes: Sizes) -> dict[str, Any]:
    """Figure 4: one idle worker process per system, all up; tries rotate across systems."""
    names = [n for n in names if not SYSTEMS[n].only]
    mp = multiprocessing.get_context("spawn")
    procs_: list[Any] = []
    samples: dict[str, list[float]] = {n: [] for n in names}
    with databases(admin, names) as systems:
        try:
            for s in systems.values():
                out: Any = mp.Queue()
                proc = s.spawn_serve(mp, out)
                proc.start()
                procs_.append(proc)
                kind, _ = out.get(timeout=120)
                assert kind == "ready"
            time.sleep(2.0)  # the workers' start-up (listeners, pools, DBOS launch)
            for s in systems.values():
                s.open()
            for i in range(-3, sizes.tries):  # three untimed warm-up tries
                for name, s in systems.items():
                    took = s.ping(i + 1000 if i < 0 else i)
                    if i >= 0:
                        samples[name].append(took * 1e3)
                    time.sleep(0.05)
        finally:
            for s in systems.values():
                if hasattr(s, "runner") or hasattr(s, "conn") or hasattr(s, "engine"):
                    try:
                        s.close()
                    except Exception as exc:
                        print(f"  {s.name}: close failed: {exc!r}", file=sys.stderr)
            stop = getattr(systems.get("raw"), "_stop", None)
            if stop is not None:
                stop.set()
            for proc in procs_:
                proc.terminate()
            for proc in procs_:
                proc.join(timeout=15)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    return {
        name: {
            "p50_ms": statistics.median(v),
            "p99_ms": percentile(v, 99),
            "samples_ms": v,
        }
        for name, v in samples.items()
        if v
    }


# --- oban in another interpreter -------------------------------------------------------------


def oban_elsewhere(python: str, admin: URL, sizes: Sizes) -> dict[str, Any]:
    """Figures 3 and 4 of oban, run by ``python`` (a >= 3.12 venv with oban and cyclone)."""
    cmd = [
        python,
        "-m",
        "bench.peers",
        "--child-oban",
        "--url",
        admin.render_as_string(hide_password=False),
        "--jobs",
        str(sizes.jobs),
        "--tries",
        str(sizes.tries),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"oban run failed: {done.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return data


# --- reporting --------------------------------------------------------------------------------

COLUMNS = [
    ("new_per_s", "1. new keys/s", True),
    ("dup_us", "2. duplicate µs/call", False),
    ("jobs_per_s", "3. drain jobs/s", True),
    ("p50_ms", "4. submit->finished p50 ms", False),
    ("p99_ms", "4. p99 ms", False),
]


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _ratio(r: float) -> str:
    return f"{r:.2f}x" if r >= 0.01 else f"{r:.4f}x"


def cell(results: dict[str, Any], name: str, key: str) -> tuple[str, float | None]:
    """The shown value with its ratio to raw, and the ratio alone (None if n/a)."""
    got = results["systems"].get(name, {})
    if key not in got:
        why = got.get("why", {}).get(key) or got.get("why", {}).get("*") or "not run"
        return f"n/a ({why})", None
    raw = results["systems"].get("raw", {}).get(key)
    value = got[key]
    if not raw:
        return _fmt(value), None
    return f"{_fmt(value)} ({_ratio(value / raw)})", value / raw


def table_rows(results: dict[str, Any]) -> list[list[str]]:
    return [
        [name, *(cell(results, name, key)[0] for key, _title, _higher in COLUMNS)]
        for name in results["order"]
    ]


def print_table(results: dict[str, Any]) -> None:
    headers = ["system", *(title for _k, title, _h in COLUMNS)]
    rows = table_rows(results)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for r in [headers, *rows]:
            print(" | ".join(r))
        return
    table = Table(title="cyclone and its peers (value, and ratio to raw in the same run)")
    for h in headers:
        table.add_column(h, overflow="fold")
    for r in rows:
        table.add_row(*r)
    Console(width=200).print(table)


def markdown(results: dict[str, Any]) -> str:
    headers = ["system", *(title for _k, title, _h in COLUMNS)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(results)]
    return "\n".join(lines)


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = results["order"]
    fig, axes = plt.subplots(1, len(COLUMNS), figsize=(4 * len(COLUMNS), 0.5 * len(names) + 2.5))
    for ax, (key, title, higher) in zip(axes, COLUMNS, strict=True):
        ratios = [cell(results, name, key)[1] for name in names]
        ys = list(range(len(names)))
        colors = [
            "tab:gray" if n == "raw" else "tab:blue" if n == "cyclone" else "tab:orange"
            for n in names
        ]
        ax.barh(ys, [r or 0 for r in ratios], color=colors)
        for y, r in zip(ys, ratios, strict=True):
            ax.text(
                r or 0, y, f" {_ratio(r)}" if r is not None else " n/a", va="center", fontsize=8
            )
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(ys, names)
        ax.invert_yaxis()
        ax.set_xlim(0, max([r or 0 for r in ratios] + [1.0]) * 1.3)
        better = "higher is better" if higher else "lower is better"
        ax.set_title(f"{title}\nx raw, linear ({better})", fontsize=9)
    meta = results["meta"]
    fig.suptitle(
        f"cyclone and its peers, ratio to raw psycopg in the same run — {meta['date']}, "
        f"{meta['nproc']} cores, PostgreSQL {meta['postgres']}, "
        f"load {meta['loadavg_start'][0]:.2f}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("CYCLONE_DATABASE_URL", DEFAULT_URL),
        help="server URL (throwaway databases are created on it)",
    )
    parser.add_argument("--only", default=",".join(SYSTEMS), help="systems, comma-separated")
    parser.add_argument("--quick", action="store_true", help="small N: a smoke run")
    parser.add_argument("--new-keys", type=int, default=None, help="figure 1 N (default 2,000)")
    parser.add_argument("--duplicates", type=int, default=None, help="figure 2 N (default 1,000)")
    parser.add_argument("--jobs", type=int, default=None, help="figure 3 N (default 2,000)")
    parser.add_argument("--tries", type=int, default=None, help="figure 4 tries (default 30)")
    parser.add_argument(
        "--figures", default="1234", help="figures to run, e.g. '12' or '34' (default: all)"
    )
    default_oban = ROOT / ".venv-oban" / "bin" / "python"
    parser.add_argument(
        "--oban-python",
        default=str(default_oban) if default_oban.exists() else "",
        help="a Python >= 3.12 with oban and cyclone, when this one cannot import oban "
        "(default: .venv-oban/bin/python if present)",
    )
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    parser.add_argument("--report", action="store_true", help="reprint and redraw peers.json")
    parser.add_argument("--child-oban", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out_json = RESULTS / "peers.json"
    if args.report:
        saved = json.loads(out_json.read_text())
        print_table(saved)
        chart(saved, ROOT / "docs" / "bench-peers.png")
        return 0
    sizes = Sizes(500, 200, 500, 10) if args.quick else Sizes()
    sizes = Sizes(
        args.new_keys or sizes.new_keys,
        args.duplicates or sizes.duplicates,
        args.jobs or sizes.jobs,
        args.tries or sizes.tries,
    )
    admin = make_url(args.url)
    if args.child_oban:  # inside the >= 3.12 interpreter: oban's figures 3 and 4, as JSON
        data = {**fig_drain(admin, ["oban"], sizes), "latency": fig_latency(admin, ["oban"], sizes)}
        data["meta"] = {"python": platform.python_version(), "versions": versions(["oban"])}
        print(json.dumps(data))
        return 0

    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(wanted) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems: {sorted(unknown)}; known: {list(SYSTEMS)}")
    order = [n for n in SYSTEMS if n in wanted]
    systems: dict[str, dict[str, Any]] = {n: {"why": {}} for n in order}
    here = []
    oban_python = ""
    for name in order:
        cls = SYSTEMS[name]
        why = cls.missing()
        if name == "oban" and why and args.oban_python:
            oban_python, why = args.oban_python, ""
        elif why:
            systems[name]["why"]["*"] = why
            continue
        if cls.no_dedup:
            systems[name]["why"]["new_per_s"] = systems[name]["why"]["dup_us"] = cls.no_dedup
        if cls.only:
            systems[name]["why"]["*"] = f"reference row, figure {cls.only} only"
        if not oban_python or name != "oban":
            here.append(name)
        systems[name]["dedup"] = cls.dedup or "-"

    with psycopg.connect(conninfo(admin)) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    started = time.perf_counter()
    results: dict[str, Any] = {
        "meta": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "git": git_describe(),
            "nproc": os.cpu_count(),
            "postgres": row[0] if row else "?",
            "python": platform.python_version(),
            "platform": platform.platform(),
            "sizes": asdict(sizes),
            "loadavg_start": os.getloadavg(),
            "versions": versions(order),
            "oban_python": oban_python,
        },
        "order": order,
        "systems": systems,
    }
    print(f"systems {here} here, oban via {oban_python or '-'}; {sizes}", flush=True)
    if "1" in args.figures or "2" in args.figures:
        t0 = time.perf_counter()
        for name, got in fig_submit(admin, here, sizes).items():
            systems[name].update(got)
        print(f"figures 1-2: {time.perf_counter() - t0:.1f} s", flush=True)
    if "3" in args.figures:
        t0 = time.perf_counter()
        for name, got in fig_drain(admin, here, sizes).items():
            systems[name].update(got)
        print(f"figure 3: {time.perf_counter() - t0:.1f} s", flush=True)
    if "4" in args.figures:
        t0 = time.perf_counter()
        for name, got in fig_latency(admin, here, sizes).items():
            systems[name].update(got)
        print(f"figure 4: {time.perf_counter() - t0:.1f} s", flush=True)
    if oban_python and ("3" in args.figures or "4" in args.figures):
        t0 = time.perf_counter()
        try:
            data = oban_elsewhere(oban_python, admin, sizes)
            systems["oban"].update(data.get("oban", {}))
            systems["oban"].update(data.get("latency", {}).get("oban", {}))
            results["meta"]["oban_run"] = data.get("meta", {})
        except Exception as exc:
            systems["oban"]["why"]["*"] = f"its run failed: {exc}"[:300]
        print(f"oban (figures 3-4 in {oban_python}): {time.perf_counter() - t0:.1f} s", flush=True)
    results["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    results["meta"]["loadavg_end"] = os.getloadavg()
    results["markdown"] = markdown(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"wrote {out_json}")
    if not args.no_chart:
        (ROOT / "docs").mkdir(exist_ok=True)
        chart(results, ROOT / "docs" / "bench-peers.png")
        print("wrote docs/bench-peers.png")
    return 0


def versions(names: Sequence[str]) -> dict[str, str]:
    from importlib import metadata

    got = {"cyclone": cyclone.__version__ if hasattr(cyclone, "__version__") else "?"}
    for name in ["sqlalchemy", "psycopg", *names]:
        try:
            got[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return got


if __name__ == "__main__":
    sys.exit(main())
