"""The two systems every peer is measured beside: the raw psycopg baseline and cyclone."""

from __future__ import annotations

import json
import time
from typing import Any

import psycopg
import sqlalchemy as sa

import cyclone
from bench import procs, workloads
from bench.systems.system import System, key

CYCLONE_CONCURRENCY = 4  # cyclone.Worker's default


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
                ("bench_one", key(i), json.dumps(workloads.payload(i))),
            ).fetchone()
            assert row is not None

    def dup(self, idx: range) -> None:
        for i in idx:
            row = self.conn.execute(
                workloads.RAW_INSERT_OR_SELECT,
                {"wf": "bench_one", "key": key(i), "input": json.dumps(workloads.payload(i))},
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
                self.engine, key(i), workloads.payload(i)
            )
            assert created

    def dup(self, idx: range) -> None:
        for i in idx:
            _run, created = workloads.one_step.submit_once(
                self.engine, key(i), workloads.payload(i)
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
