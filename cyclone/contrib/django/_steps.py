"""Django's connection housekeeping around each step a worker runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections


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
