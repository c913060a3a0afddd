"""Purging and vacuuming a large runs table while submitters run (docs/scaling.md).

Run by hand: ``python -m bench.purge [--runs N] [--submitters N] [--batch N] [--phase S]
[--url URL]``. It creates a throwaway database, submits one run of a one-step workflow
through cyclone and lets a Worker finish it, then clones that run and its step ``--runs``
times (one ``INSERT ... SELECT generate_series`` per million, every column copied from
the finished run as the database shows it, so the clone follows the schema), ended a day
ago. With ``--submitters`` threads submitting new keys (``submit_once``) all along, it
times four phases: ``--phase`` seconds before, ``Client.purge_terminal_runs`` of every
clone in batches of ``--batch``, a plain ``VACUUM (ANALYZE)`` of the runs and jobs tables,
and ``--phase`` seconds after. Each phase reports the submits per second and their
latency (median, p99, worst) and the tables' size; the result is written to
``purge.json`` in ``bench/results`` (or ``CYCLONE_BENCH_RESULTS``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import cyclone
from bench import db, workloads
from bench.results import RESULTS

FILL_CHUNK = 1_000_000
SWAPPED = {"submit_key", "created_at", "finalized_at", "run_id"}
"""Columns the clone sets itself; every other column is copied from the finished run."""


def columns(conn: psycopg.Connection[Any], table: str) -> list[str]:
    """The table's columns that the clone copies (not generated, not set by the clone)."""
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND is_identity = 'NO' AND column_name <> 'id' ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [r[0] for r in rows if r[0] not in SWAPPED]


def fill(dsn: str, runs: int) -> float:
    """Clone the one finished run and its job ``runs`` times; seconds taken."""
    t0 = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        run_cols, job_cols = columns(conn, "cyclone_runs"), columns(conn, "cyclone_jobs")
        copy_run = ", ".join(f"t.{c}" for c in run_cols)
        copy_job = ", ".join(f"j.{c}" for c in job_cols)
        statement = f"""
            WITH t AS (SELECT * FROM cyclone_runs WHERE state = 'completed' LIMIT 1),
            made AS (
                INSERT INTO cyclone_runs ({", ".join(run_cols)}, submit_key, created_at,
                                          finalized_at)
                SELECT {copy_run}, 'filler-' || g, now() - interval '1 day',
                       now() - interval '1 day'
                FROM t, generate_series(%(lo)s::int, %(hi)s::int) g
                RETURNING id
            )
            INSERT INTO cyclone_jobs ({", ".join(job_cols)}, run_id, created_at, finalized_at)
            SELECT {copy_job}, made.id, now() - interval '1 day', now() - interval '1 day'
            FROM made, (SELECT * FROM cyclone_jobs WHERE run_id = (SELECT id FROM t)) j
        """
        for lo in range(1, runs + 1, FILL_CHUNK):
            hi = min(lo + FILL_CHUNK - 1, runs)
            conn.execute(statement, {"lo": lo, "hi": hi})
            print(f"  filled {hi:,} runs ({time.perf_counter() - t0:.0f} s)", flush=True)
        conn.execute("VACUUM ANALYZE cyclone_runs")
        conn.execute("VACUUM ANALYZE cyclone_jobs")
    return time.perf_counter() - t0


class Submitters:
    """Threads submitting new keys as fast as they can, each latency noted with its time."""

    def __init__(self, engine: sa.Engine, n: int) -> None:
        self.engine = engine
        self.stop = threading.Event()
        self.samples: list[tuple[float, float]] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.submit, args=(i,)) for i in range(n)]

    def submit(self, me: int) -> None:
        i = 0
        while not self.stop.is_set():
            t0 = time.perf_counter()
            workloads.one_step.submit_once(self.engine, f"live-{me}-{i}", workloads.payload(i))
            t1 = time.perf_counter()
            with self.lock:
                self.samples.append((t1, t1 - t0))
            i += 1

    def __enter__(self) -> Submitters:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """Submits/s and latency (ms) of the submits that ended in [t0, t1)."""
        with self.lock:
            lat = sorted(d for at, d in self.samples if t0 <= at < t1)
        if not lat:
            return {"submits_per_s": 0.0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        return {
            "submits_per_s": len(lat) / (t1 - t0),
            "p50_ms": statistics.median(lat) * 1e3,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
            "max_ms": lat[-1] * 1e3,
        }


def sizes(dsn: str) -> dict[str, int]:
    """Bytes of the runs and jobs tables with their indexes and TOAST."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size('cyclone_runs'), pg_total_relation_size('cyclone_jobs')"
        ).fetchone()
    assert row is not None
    return {"runs_bytes": int(row[0]), "jobs_bytes": int(row[1])}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.purge", description=__doc__)
    p.add_argument("--runs", type=int, default=1_000_000, help="finished runs to purge")
    p.add_argument("--submitters", type=int, default=2, help="threads submitting meanwhile")
    p.add_argument("--batch", type=int, default=10_000, help="purge batch size")
    p.add_argument("--phase", type=float, default=10.0, help="seconds before and after")
    p.add_argument("--url", default=os.environ.get("CYCLONE_DATABASE_URL", db.DEFAULT_URL))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    admin = make_url(args.url)
    url = db.create_database(admin, "cyclone_purge")
    try:
        db.upgrade(url)
        dsn = db.conninfo(url)
        engine = sa.create_engine(url, pool_size=args.submitters + 2)
        workloads.one_step.submit_once(engine, "template", workloads.payload(0))
        cyclone.Worker(engine, workflows=[workloads.one_step], sweep=False).drain()
        took = fill(dsn, args.runs)
        print(f"filled {args.runs:,} finished runs in {took:.0f} s", flush=True)
        result: dict[str, Any] = {"runs": args.runs, "fill_s": took, "phases": {}}
        client = cyclone.Client(engine)
        with Submitters(engine, args.submitters) as live:
            marks: list[tuple[str, float, float, dict[str, int]]] = []
            size0 = sizes(dsn)
            t = time.perf_counter()
            live.stop.wait(args.phase)
            marks.append(("before", t, time.perf_counter(), size0))
            t = time.perf_counter()
            purged = client.purge_terminal_runs(
                older_than=timedelta(hours=1), batch_size=args.batch
            )
            marks.append(("purge", t, time.perf_counter(), sizes(dsn)))
            t = time.perf_counter()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("VACUUM (ANALYZE) cyclone_runs")
                conn.execute("VACUUM (ANALYZE) cyclone_jobs")
            marks.append(("vacuum", t, time.perf_counter(), sizes(dsn)))
            t = time.perf_counter()
            live.stop.wait(args.phase)
            marks.append(("after", t, time.perf_counter(), sizes(dsn)))
        result["purged"] = purged
        for name, t0, t1, size in marks:
            phase = {"seconds": t1 - t0, **live.between(t0, t1), **size}
            result["phases"][name] = phase
            print(
                f"{name:>7}: {t1 - t0:7.1f} s  {phase['submits_per_s']:7,.0f} submits/s  "
                f"p50 {phase['p50_ms']:6.2f} ms  p99 {phase['p99_ms']:7.2f} ms  "
                f"max {phase['max_ms']:8.1f} ms  runs {size['runs_bytes'] / 2**20:8,.0f} MB  "
                f"jobs {size['jobs_bytes'] / 2**20:8,.0f} MB",
                flush=True,
            )
        print(f"purged {purged:,} runs at {purged / result['phases']['purge']['seconds']:,.0f}/s")
        engine.dispose()
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "purge.json").write_text(json.dumps(result, indent=2))
    finally:
        db.drop_database(admin, url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
