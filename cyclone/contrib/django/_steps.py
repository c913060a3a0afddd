"""Django's connection housekeeping around each step a worker runs."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections

_thread = threading.local()


class _Kept:
    """The Django connections one step thread keeps between steps (``CONN_MAX_AGE`` above
    0), closed when the thread ends.

    Django closes a thread's connections only in that thread, and a worker's step thread
    that ends leaves its wrappers to the garbage collector, which may reach them much
    later: a test runner then cannot drop its test database. A thread's ``threading.local``
    values go when the thread does, and with them this object.
    """

    def __init__(self) -> None:
        self.wrappers: dict[int, Any] = {}

    def __del__(self) -> None:
        for wrapper in self.wrappers.values():
            connection = getattr(wrapper, "connection", None)
            if connection is not None:
                with contextlib.suppress(Exception):  # the thread is gone: no one to tell
                    connection.close()


def _close_stale() -> None:
    """Close this thread's Django connections that broke or outlived ``CONN_MAX_AGE``.

    This is what Django's ``close_old_connections`` does at the start and end of every
    request, except that a connection inside an ``atomic()`` block is left alone: the
    step was called from code that holds the transaction (a test, or a worker draining
    inside one), and closing it would throw that transaction away.
    """
    for conn in connections.all(initialized_only=True):
        if not conn.in_atomic_block:
            conn.close_if_unusable_or_obsolete()


@contextmanager
def step_context() -> Iterator[None]:
    """Treat each step like a request: close stale connections before and after it.

    With it a long-running worker reconnects after a database restart and honours
    ``CONN_MAX_AGE`` (with the default of 0, each step closes its connections).
    """
    _close_stale()
    try:
        yield
    finally:
        _close_stale()
        kept = getattr(_thread, "kept", None)
        if kept is None:
            kept = _thread.kept = _Kept()
        for conn in connections.all(initialized_only=True):
            if conn.connection is not None:
                kept.wrappers[id(conn)] = conn
