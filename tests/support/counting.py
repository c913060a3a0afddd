"""Count the statements that reach the driver, whichever path sends them.

cyclone's hot paths send compiled SQL on the pool's psycopg connection, which SQLAlchemy's
cursor events never see; a ``psycopg.Cursor`` subclass given as the engine's
``cursor_factory`` sees those and SQLAlchemy's alike (``Connection.execute`` and
SQLAlchemy both create their cursors through it). BEGIN and COMMIT are not counted:
psycopg sends them itself, not through a cursor. Nor is what cyclone's listener thread
sends (its LISTEN, and the ``SELECT 1`` it pings with when quiet): an engine's listener,
started by any earlier test of the process, runs on its own schedule.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

import psycopg

LISTENER_THREAD = "cyclone-listener"
"""The name of the thread of ``cyclone._notify``'s listener."""

_lock = threading.Lock()
_counters: list[Recorder] = []


class Recorder:
    """Receives ``(thread name, statement)`` for each statement while registered."""

    def record(self, thread: str, statement: str) -> None:
        raise NotImplementedError

    def __enter__(self) -> Recorder:
        with _lock:
            _counters.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _counters.remove(self)


def _record(query: Any) -> None:
    text = query.decode() if isinstance(query, bytes) else str(query)
    thread = threading.current_thread().name
    if thread == LISTENER_THREAD or text.lstrip().upper().startswith("LISTEN"):
        return
    with _lock:
        counters = list(_counters)
    for counter in counters:
        counter.record(thread, text)


class CountingCursor(psycopg.Cursor[Any]):
    """A psycopg cursor that reports every statement it executes to the registered recorders."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> CountingCursor:  # type: ignore[override]
        _record(query)
        super().execute(query, params, **kwargs)
        return self

    def executemany(self, query: Any, params_seq: Iterable[Any], **kwargs: Any) -> None:
        _record(query)
        super().executemany(query, params_seq, **kwargs)


class ThreadStatements(Recorder):
    """The statements sent by one thread."""

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.statements: list[str] = []
        self.timed: list[tuple[float, str]] = []
        """``(time.monotonic(), statement)`` of each, as it was sent."""
        self.lock = threading.Lock()

    def record(self, thread: str, statement: str) -> None:
        if thread == self.thread:
            with self.lock:
                self.statements.append(statement)
                self.timed.append((time.monotonic(), statement))

    def count(self) -> int:
        with self.lock:
            return len(self.statements)
