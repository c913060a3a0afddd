"""``bench.profile ids``: random run ids against time-ordered ones, on large tables.

Two databases, each filled with ``size`` completed runs (one completed job each, as figure
f fills them): one as shipped, whose runs get time-ordered ids (``cyclone_uuid7()``), and
one whose ``cyclone_runs.id`` defaults to ``gen_random_uuid()`` again, as before revision
``cyclone_0027_ordered_run_ids``. Then, in turns that alternate the order: a
``CHECKPOINT``, ``n`` new keys of the 3-step workflow (the WAL they wrote per submit, and
the part of it that is whole pages written on a page's first change after the
checkpoint, read with ``pg_walinspect`` where the server has it), a ``CHECKPOINT``, and
a one-process drain of those runs (steps per second). The WAL is a count, steady from
run to run; the times swing with the checkpoints' writes and the machine.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

import cyclone
from bench import db, workloads
from bench.figures.growth import FILL_CYCLONE

CHUNK = 200_000


def ids(url: str, n: int, size: int, turns: int) -> None:
    """Print, per variant, the fill's time and the medians over ``turns`` turns."""
    admin = make_url(url)
    made: dict[str, URL] = {}
    engines: dict[str, sa.Engine] = {}
    inspect = True
    try:
        for variant in ("time-ordered", "random"):
            made[variant] = target = db.create_database(admin)
            db.install(target)
            inspect = _walinspect(target) and inspect
            if variant == "random":
                db.execute(
                    target, "ALTER TABLE cyclone_runs ALTER COLUMN id SET DEFAULT gen_random_uuid()"
                )
            t0 = time.perf_counter()
            _fill(target, size)
            print(f"{variant}: {size:,} runs filled in {time.perf_counter() - t0:.0f} s")
            db.execute(target, "VACUUM ANALYZE")
            engines[variant] = sa.create_engine(target)
        got: dict[str, dict[str, list[float]]] = {v: {} for v in made}
        for turn in range(turns):
            order = list(made) if turn % 2 == 0 else list(reversed(made))
            for variant in order:
                for what, value in _turn(made[variant], engines[variant], n, turn, inspect).items():
                    got[variant].setdefault(what, []).append(value)
        for variant, measured in got.items():
            medians = ", ".join(f"{k} {statistics.median(v):,.0f}" for k, v in measured.items())
            print(f"{variant:>12}: {medians}")
    finally:
        for engine in engines.values():
            engine.dispose()
        for target in made.values():
            db.drop_database(admin, target)


def _walinspect(url: URL) -> bool:
    """Whether ``pg_walinspect`` (PostgreSQL 15 and later) could be created in ``url``."""
    try:
        db.execute(url, "CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    except psycopg.Error:
        return False
    return True


def _fill(url: URL, size: int) -> None:
    plan = workloads.one_step.plan()
    for lo in range(0, size, CHUNK):
        db.execute(
            url,
            FILL_CYCLONE,
            graph=plan.graph,
            definition=str(plan.definition),
            lo=lo,
            hi=min(size, lo + CHUNK) - 1,
        )


def _turn(url: URL, engine: sa.Engine, n: int, turn: int, inspect: bool) -> dict[str, float]:
    db.execute(url, "CHECKPOINT")
    start = _lsn(url)
    t0 = time.perf_counter()
    for i in range(n):
        workloads.three_step.submit_once(engine, f"t{turn}-{i}", workloads.payload(i))
    took = time.perf_counter() - t0
    end = _lsn(url)
    out: dict[str, float] = {"us/submit": took / n * 1e6}
    if inspect:
        row = db.execute(
            url,
            "SELECT sum(combined_size), sum(fpi_size) "
            "FROM pg_get_wal_stats(%(a)s::pg_lsn, %(b)s::pg_lsn)",
            a=start,
            b=end,
        )
        assert row is not None
        out["WAL B/submit"] = int(row[0]) / n
        out["whole-page B/submit"] = int(row[1]) / n
    else:
        row = db.execute(url, "SELECT %(b)s::pg_lsn - %(a)s::pg_lsn", a=start, b=end)
        assert row is not None
        out["WAL B/submit"] = int(row[0]) / n
    db.execute(url, "CHECKPOINT")
    t0 = time.perf_counter()
    steps = cyclone.Worker(engine, workflows=[workloads.three_step], sweep=False).drain()
    out["steps/s"] = steps / (time.perf_counter() - t0)
    return out


def _lsn(url: URL) -> Any:
    row = db.execute(url, "SELECT pg_current_wal_lsn()::text")
    assert row is not None
    return row[0]
