"""Count the statements that reach the driver, whichever path sends them.

cyclone's hot paths send compiled SQL on the pool's psycopg connection, which SQLAlchemy's
cursor events never see; a ``psycopg.Cursor`` subclass given as the engine's
``cursor_factory`` sees those and SQLAlchemy's alike (``Connection.execute`` and
SQLAlchemy both create their cursors through it). BEGIN and COMMIT are not counted:
psycopg sends them itself, not through a cursor.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import psycopg

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
    # The LISTEN of cyclone's listener thread connection is not a statement under test.
    if text.lstrip().upper().startswith("LISTEN"):
        return
    thread = threading.current_thread().name
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
