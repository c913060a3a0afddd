"""Where a psycopg connection dropped open was opened, in the failure it causes.

psycopg warns (``ResourceWarning``) when a connection is garbage-collected open; pyproject's
``filterwarnings = ["error"]`` turns that into an exception in ``__del__``, which pytest
reports as a failure of the test during which the collection ran. That is the leaking test
when the connection was dropped by reference counting, but a later one when it sat in a
reference cycle until the collector ran; and psycopg's message names neither the test nor
the code that opened the connection (its warning carries no ``source`` for tracemalloc).

:func:`install` makes the message say both: every psycopg connection of the test process
keeps the test running and the stack (file and line, no source text, no frames kept alive)
when it was opened, about 20 us per connection. A connection found open when collected is
closed first, so that psycopg itself does not warn a second time.
"""

from __future__ import annotations

import contextlib
import os
import traceback
import warnings
from typing import Any

import psycopg
from psycopg._connection_base import BaseConnection

_OPENED_AT = "_cyclone_tests_opened_at"
_PSYCOPG = os.path.dirname(psycopg.__file__)
_installed = False


def install() -> None:
    """Record where each psycopg connection is opened; say it when one is collected open."""
    global _installed
    if _installed:
        return
    _installed = True
    init = psycopg.Connection.__init__
    delete = BaseConnection.__del__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        frames = traceback.StackSummary.extract(
            traceback.walk_stack(None), limit=48, lookup_lines=False
        )
        # Innermost first: leave out this function and psycopg's connect.
        while frames and (frames[0].filename == __file__ or _PSYCOPG in frames[0].filename):
            del frames[0]
        frames.reverse()
        setattr(self, _OPENED_AT, (os.environ.get("PYTEST_CURRENT_TEST"), frames))

    def reporting_del(self: Any, *args: Any) -> None:
        opened = getattr(self, _OPENED_AT, None)
        if opened is not None and _open(self):
            test, stack = opened
            with contextlib.suppress(Exception):  # the report matters more than a clean close
                self.close()
            warnings.warn(
                f"a psycopg connection was garbage-collected while still open; it was "
                f"opened during {test or 'no test'}, at:\n" + "".join(stack.format()),
                ResourceWarning,
                stacklevel=1,
            )
        delete(self, *args)

    psycopg.Connection.__init__ = recording_init  # type: ignore[method-assign]
    BaseConnection.__del__ = reporting_del  # type: ignore[method-assign]


def _open(conn: Any) -> bool:
    """What psycopg's ``__del__`` checks before it warns: opened, not closed, not pooled."""
    return hasattr(conn, "pgconn") and not conn.closed and not hasattr(conn, "_pool")
