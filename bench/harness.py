"""What every figure of ``bench.run`` is measured with: its sizes, its engines on the
throwaway database, and the figures it has recorded so far.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL

from bench import db, measure, statements
from bench.results import Figure


@dataclass(frozen=True)
class Sizes:
    new_keys: int
    duplicates: int
    jobs: int
    tries: int
    batches: tuple[int, ...]
    small: int
    large: int
    grow_ops: int
    backlog: int = 50_000
    mixed_seconds: float = 60.0
    mixed_rate: float = 1_000.0
    memory_jobs: int = 10_000

    @classmethod
    def full(cls) -> Sizes:
        return cls(5_000, 1_000, 5_000, 50, (100, 1_000), 10_000, 1_000_000, 500)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            500, 200, 1_000, 20, (100, 1_000), 10_000, 100_000, 200, 5_000, 10.0, 500.0, 1_000
        )


class Bench:
    """The run's database, engines and recorded figures, handed to every figure."""

    def __init__(self, url: URL, sizes: Sizes, rounds: int, concurrency: int) -> None:
        self.url = url
        self.sa_url = url.render_as_string(hide_password=False)
        self.dsn = db.conninfo(url)
        self.sizes = sizes
        self.rounds = rounds
        self.concurrency = concurrency
        # Timed figures use a plain engine; statements are counted on a second one whose
        # cursors report what they execute (that costs a few microseconds a statement).
        self.engine = sa.create_engine(url, pool_size=5, max_overflow=5)
        self.counted = statements.counted_engine(url, pool_size=5, max_overflow=5)
        self.figures: dict[str, Figure] = {}
        self.statements: dict[str, dict[str, float]] = {}
        self.mp = multiprocessing.get_context("spawn")

    def close(self) -> None:
        # The database is dropped WITH (FORCE): this process's LISTEN thread, idle, ends
        # when its connection does.
        self.engine.dispose()
        self.counted.dispose()

    def fig(self, fid: str, title: str, unit: str, higher: bool, **kw: Any) -> Figure:
        """The figure ``fid``, created on first use (later rounds append to it)."""
        if fid not in self.figures:
            self.figures[fid] = Figure(fid, title, unit, higher, **kw)
        return self.figures[fid]

    def sql(self, statement: str, **params: Any) -> None:
        db.execute(self.dsn, statement, **params)

    def reset(self) -> None:
        """Empty cyclone's and the raw tables (see :func:`bench.db.truncate`)."""
        db.truncate(self.dsn)

    def analyze(self) -> None:
        """ANALYZE cyclone's and the raw tables, as autovacuum would after a bulk load."""
        db.analyze(self.dsn)

    def raw_conn(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True)

    def drain(self, target: Any, args: tuple[Any, ...], nproc: int) -> tuple[float, int]:
        """Jobs/s and jobs done of ``nproc`` spawned drain processes released at once."""
        timed = measure.spawn_timed(self.mp, target, [args] * nproc)
        return timed.rate, timed.total
