"""Claim runnable jobs in batches with ``FOR UPDATE SKIP LOCKED``.

The CTE fences the ``LIMIT``: without it the planner may lock more rows than it returns.
A step of a run that is no longer running is never claimed, even if a late re-queue
raced with the run's cancellation.
The same statement reads the run's input and the outputs of the steps a job comes after,
so a claimed job needs no further query before it runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import (
    Connection,
    Text,
    and_,
    bindparam,
    cast,
    exists,
    func,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from cyclone.schema import jobs, runs
from cyclone.states import JobState, RunState


@dataclass(frozen=True, slots=True)
class Claimed:
    """One claimed job with everything needed to run it."""

    id: int
    run_id: uuid.UUID | None
    workflow: str | None
    kind: str
    queue: str
    attempt: int
    max_attempts: int
    deadline: datetime | None
    input: str | None
    upstream: dict[str, msgspec.Raw]


def claim_jobs_stmt(*, by_queue: bool) -> Any:
    """Claim up to ``:limit`` runnable jobs; ``by_queue`` adds the ``:queues`` filter."""
    queue_filter = (
        jobs.c.queue == func.any(bindparam("queues", type_=ARRAY(Text))) if by_queue else true()
    )
    picked = (
        select(jobs.c.id)
        .where(
            jobs.c.state == JobState.AVAILABLE.value,
            queue_filter,
            jobs.c.scheduled_at <= func.now(),
            or_(
                jobs.c.workflow == func.any(bindparam("workflows", type_=ARRAY(Text))),
                and_(
                    jobs.c.workflow.is_(None),
                    jobs.c.kind == func.any(bindparam("kinds", type_=ARRAY(Text))),
                ),
            ),
            or_(jobs.c.deadline.is_(None), jobs.c.deadline > func.now()),
            or_(
                jobs.c.run_id.is_(None),
                exists().where(runs.c.id == jobs.c.run_id, runs.c.state == RunState.RUNNING.value),
            ),
        )
        .order_by(jobs.c.priority, jobs.c.scheduled_at, jobs.c.id)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    claimed = (
        update(jobs)
        .where(jobs.c.id == picked.c.id)
        .values(
            state=JobState.RUNNING.value,
            attempt=jobs.c.attempt + 1,
            worker_id=bindparam("me", type_=Text),
            attempted_at=func.now(),
            heartbeat_at=func.now(),
        )
        .returning(
            jobs.c.id,
            jobs.c.run_id,
            jobs.c.workflow,
            jobs.c.kind,
            jobs.c.queue,
            jobs.c.attempt,
            jobs.c.max_attempts,
            jobs.c.deadline,
            jobs.c.deps,
            jobs.c.args,
        )
        .cte("claimed")
    )
    upstream = jobs.alias("upstream")
    outputs = (
        select(cast(func.jsonb_object_agg(upstream.c.kind, upstream.c.output), Text))
        .where(
            upstream.c.run_id == claimed.c.run_id,
            upstream.c.kind == func.any(claimed.c.deps),
        )
        .scalar_subquery()
    )
    return select(
        claimed.c.id,
        claimed.c.run_id,
        claimed.c.workflow,
        claimed.c.kind,
        claimed.c.queue,
        claimed.c.attempt,
        claimed.c.max_attempts,
        claimed.c.deadline,
        cast(func.coalesce(runs.c.input, claimed.c.args), Text),
        outputs,
    ).select_from(claimed.outerjoin(runs, runs.c.id == claimed.c.run_id))


_CLAIM_ANY_QUEUE = claim_jobs_stmt(by_queue=False)
_CLAIM_BY_QUEUE = claim_jobs_stmt(by_queue=True)
_upstream_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])


def claim_jobs(
    conn: Connection,
    *,
    worker_id: str,
    queues: Sequence[str] | None,
    workflows: Sequence[str],
    kinds: Sequence[str],
    limit: int,
) -> list[Claimed]:
    """Claim up to ``limit`` runnable jobs for this worker, highest priority first.

    ``queues=None`` claims from every queue.
    """
    rows = conn.execute(
        _CLAIM_ANY_QUEUE if queues is None else _CLAIM_BY_QUEUE,
        {
            "me": worker_id,
            "queues": None if queues is None else list(queues),
            "workflows": list(workflows),
            "kinds": list(kinds),
            "limit": limit,
        },
    ).all()
    return [
        Claimed(
            id=row[0],
            run_id=row[1],
            workflow=row[2],
            kind=row[3],
            queue=row[4],
            attempt=row[5],
            max_attempts=row[6],
            deadline=row[7],
            input=row[8],
            upstream={} if row[9] is None else _upstream_decoder.decode(row[9]),
        )
        for row in rows
    ]
