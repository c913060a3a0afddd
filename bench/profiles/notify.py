"""``bench.profile notify``: figure g's 8 submitter processes with raw's insert, raw's
insert with cyclone's NOTIFY, and ``submit_once``, with the server's wait events."""

from __future__ import annotations

import multiprocessing
import threading
from collections import defaultdict

import psycopg
import sqlalchemy as sa

from bench import db, measure, procs
from bench.figures.submitters import SUBMITTERS


def notify(engine: sa.Engine, n: int, rounds: int = 3) -> None:
    """Figure g's 8 submitter processes: raw's insert, raw's insert with cyclone's NOTIFY,
    and ``submit_once``, in turns, each with the CPU per call of the submitters and of the
    server (from /proc) and how busy the machine was.

    PostgreSQL lets one notifying commit through at a time (each holds a lock from queueing
    its notification until its commit is flushed): "raw + NOTIFY" shows what that costs
    raw's insert; the CPU columns show whether cyclone's submits reach that limit, and
    the wait events of the database's backends (sampled from pg_stat_activity) what they
    wait for.
    """
    ctx = multiprocessing.get_context("spawn")
    url = engine.url.render_as_string(hide_password=False)
    dsn = db.conninfo(engine.url)
    per_proc = max(1, n // SUBMITTERS)
    sides = ["raw", "raw-notify", "cyclone"]
    print(f"{SUBMITTERS} processes x {per_proc} new keys per turn, {rounds} rounds")
    for r in range(rounds):
        for side in sides[r % 3 :] + sides[: r % 3]:
            args = [(url, dsn, side, f"n{r}-{side}-{p}", per_proc) for p in range(SUBMITTERS)]
            with WaitEvents(dsn) as waits:
                timed = measure.spawn_timed(ctx, procs.submitter, args)
            print(f"  round {r} {side:<10} {timed.describe('submits')}", flush=True)
            print(f"    backends: {waits.summary()}", flush=True)


class WaitEvents:
    """Samples what the database's active backends wait for, every few milliseconds."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.counts: dict[str, int] = defaultdict(int)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> WaitEvents:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _sample(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.005):
                for (event,) in conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU') "
                    "FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'active' AND pid <> pg_backend_pid()"
                ):
                    self.counts[event] += 1

    def summary(self, most: int = 5) -> str:
        total = sum(self.counts.values()) or 1
        ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])[:most]
        return ", ".join(f"{event} {n / total:.0%}" for event, n in ranked)
