"""When the next job a worker serves falls due: what an idle worker sleeps until.

A job scheduled for later (a retry's backoff, a sleep) is available but not yet due, and
a run submitted with ``run_at=`` or ``delay=`` waits to be started. An idle worker that
found nothing to claim reads when the earliest of them falls due and sleeps until then
(never longer than its poll interval), so it neither polls in a busy loop nor starts the
job late. The statement reads the claim indexes' ranges of the workflows and kinds the
worker serves.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import select

from cyclone._store import executor as _executor
from cyclone._store.claim import Scope, next_due_seconds


def next_due_stmt(scope: Scope) -> Any:
    """Seconds from now until the earliest not-yet-due job or run start of ``scope``, or NULL.

    A woken claim reads the same in its own statement (``dating``, see
    :func:`cyclone._store.claim.claim_jobs_stmt`).
    """
    return select(next_due_seconds(scope))


@functools.lru_cache(maxsize=64)
def _compiled(scope: Scope) -> _executor.Compiled:
    return _executor.Compiled(next_due_stmt(scope))


def seconds_until_next_due(conn: _executor.Executor, scope: Scope) -> float | None:
    """Seconds until the earliest scheduled job of ``scope`` falls due, or None if none is."""
    rows = conn.rows(_compiled(scope), {})
    value = rows[0][0] if rows else None
    return None if value is None else max(0.0, float(value))
