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

from sqlalchemy import Float, extract, func, literal_column, or_, select, true

from cyclone._store import executor as _executor
from cyclone._store.claim import Scope, unlimited_standalone
from cyclone._store.executor import const, one_of
from cyclone.schema import jobs, runs
from cyclone.states import JobState, RunState


def next_due_stmt(scope: Scope) -> Any:
    """Seconds from now until the earliest not-yet-due job or run start of ``scope``, or NULL.

    A run submitted for later has no jobs yet: its ``start_at`` is read from
    ``ix_cyclone_runs_start``'s ranges of the served workflows.
    """
    served = or_(
        one_of(jobs.c.workflow, scope.workflows),
        unlimited_standalone(jobs, one_of(jobs.c.kind, scope.kinds)),
    )
    due: Any = (
        select(func.min(jobs.c.scheduled_at))
        .where(
            jobs.c.state == const(JobState.AVAILABLE.value),
            served,
            true() if scope.queues is None else one_of(jobs.c.queue, scope.queues),
            jobs.c.scheduled_at > func.now(),
        )
        .scalar_subquery()
    )
    if scope.workflows:
        starts = (
            select(func.min(runs.c.start_at))
            .where(
                one_of(runs.c.workflow, scope.workflows),
                runs.c.start_at.is_not(None),
                runs.c.state == const(RunState.RUNNING.value),
                runs.c.start_at > func.now(),
                # A run held by its workflow's limit (docs/flow-control.md) waits for
                # an admission, not a time.
                runs.c.start_at < literal_column("'infinity'::timestamptz"),
            )
            .scalar_subquery()
        )
        due = func.least(due, starts)
    return select(extract("epoch", due - func.now()).cast(Float))


@functools.lru_cache(maxsize=64)
def _compiled(scope: Scope) -> _executor.Compiled:
    return _executor.Compiled(next_due_stmt(scope))


def seconds_until_next_due(conn: _executor.Executor, scope: Scope) -> float | None:
    """Seconds until the earliest scheduled job of ``scope`` falls due, or None if none is."""
    rows = conn.rows(_compiled(scope), {})
    value = rows[0][0] if rows else None
    return None if value is None else max(0.0, float(value))
