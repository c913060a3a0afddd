"""What each system of ``bench.peers`` implements: one library on the four figures.

A system submits through the library's documented API in this process and runs the
library's own worker in a spawned one (:func:`drain_child`, :func:`serve_child`). The
peers are imported lazily (:func:`imp`), so that this package type-checks and imports
without them.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Callable
from typing import Any, ClassVar

import psycopg
from sqlalchemy.engine import URL, make_url

from bench import db

POLL = 0.002
"""Seconds between two status reads when a client waits for a peer's job to finish."""
DRAIN_BUDGET = 30.0
"""Seconds a drain may take; a slower worker is rated on what it finished by then."""


def imp(name: str) -> Any:
    """A peer's module, imported only when its figures run (the core venv lacks them)."""
    return importlib.import_module(name)


KEY_PREFIX = "key"


def key(i: int) -> str:
    """The deduplication key of submission ``i``."""
    return f"{KEY_PREFIX}-{i}"


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
        self.dsn = db.conninfo(url)

    @classmethod
    def missing(cls) -> str:
        """Why this system cannot run in this interpreter ('' if it can)."""
        if not cls.module:
            return ""
        try:
            for module in cls.module.split(","):
                imp(module)
        except ImportError as exc:
            return f"not importable here ({exc}); pip install -e '.[bench-peers]'"
        return ""

    def sql(self, statement: str) -> int:
        """The count a ``SELECT count(*)`` statement returns."""
        return db.count(self.dsn, statement)

    def analyze(self) -> None:
        """What autovacuum's ANALYZE would do after a bulk load (it is off on the bench server)."""
        db.analyze(self.dsn, "")

    # to implement
    def install(self) -> None:
        raise NotImplementedError

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def new(self, idx: range) -> None:
        """Submit ``key(i)`` for each i, one call at a time, each one new."""
        raise NotImplementedError

    def dup(self, idx: range) -> None:
        """Submit ``key(i)`` again for each i; each call must be deduplicated."""
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
        return mp.Process(target=drain_child, args=(self.name, self.sa_url, n, start, out))

    def spawn_serve(self, mp: Any, out: Any) -> Any:
        return mp.Process(target=serve_child, args=(self.name, self.sa_url, out))

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


def drain_child(name: str, url: str, n: int, start: Any, out: Any) -> None:
    """A spawned process: system ``name``'s worker drains ``n`` jobs once ``start`` is set."""
    from bench.systems import SYSTEMS

    system = SYSTEMS[name](make_url(url))

    def ready() -> None:
        out.put(("ready", None))
        start.wait()

    out.put(("done", system.drain(n, ready)))


def serve_child(name: str, url: str, out: Any) -> None:
    """A spawned process: system ``name``'s idle worker, until SIGTERM."""
    from bench.systems import SYSTEMS

    system = SYSTEMS[name](make_url(url))
    out.put(("ready", None))
    system.serve()
