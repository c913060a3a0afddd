"""The two systems every peer is measured beside: the raw psycopg baseline and cyclone."""

from __future__ import annotations

from typing import Any

import psycopg
import sqlalchemy as sa

from bench import db, procs, workloads
from bench.figures import latency, submit
from bench.systems.system import KEY_PREFIX, System, key

CYCLONE_CONCURRENCY = 4  # cyclone.Worker's default


class Raw(System):
    name = "raw"
    dedup = "INSERT ... ON CONFLICT DO NOTHING on a unique index"
    count_sql = "SELECT count(*) FROM raw_runs"
    done_sql = "SELECT count(*) FROM raw_jobs WHERE state = 'completed'"

    def install(self) -> None:
        db.execute(self.dsn, workloads.RAW_DDL)

    def open(self) -> None:
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.conn.execute("LISTEN raw_job_done")
        self.new_key = submit.raw_new_key(self.conn, KEY_PREFIX)

    def close(self) -> None:
        self.conn.close()

    def new(self, idx: range) -> None:
        for i in idx:
            self.new_key(i)

    def dup(self, idx: range) -> None:
        for i in idx:
            submit.raw_existing_key(self.conn, key(i), workloads.payload(i))

    def preload(self, n: int) -> None:
        db.enqueue_raw_noops(self.dsn, n)

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
        db.upgrade(self.url)

    def open(self) -> None:
        self.engine = sa.create_engine(self.url, pool_size=5, max_overflow=5)
        self.new_key = submit.new_key(workloads.one_step, self.engine, KEY_PREFIX)

    def close(self) -> None:
        self.engine.dispose()

    def new(self, idx: range) -> None:
        for i in idx:
            self.new_key(i)

    def dup(self, idx: range) -> None:
        for i in idx:
            submit.existing_key(workloads.one_step, self.engine, key(i), workloads.payload(i))

    def preload(self, n: int) -> None:
        for i in range(n):
            workloads.noop.enqueue(self.engine, i)

    def ping(self, i: int) -> float:
        return latency.ping(self.engine, f"ping-{i}", i)

    def spawn_drain(self, mp: Any, n: int, start: Any, out: Any) -> Any:
        self._finish = mp.Event()  # procs' drains take one; kept alive for the child
        return mp.Process(
            target=procs.cyclone_drain,
            args=(self.sa_url, "jobs", CYCLONE_CONCURRENCY, start, self._finish, out),
        )

    def spawn_serve(self, mp: Any, out: Any) -> Any:
        return mp.Process(target=procs.cyclone_serve, args=(self.sa_url, CYCLONE_CONCURRENCY, out))
