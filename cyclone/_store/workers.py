"""The registry of running workers (``cyclone_workers``): register, beat, stop, prune, list.

A worker writes its row once when it starts serving (:func:`register`, an upsert), beats
it from its heartbeat thread every ``heartbeat_interval`` (:func:`beat`, on that thread's
own connection, never on the claim loop), marks it when it begins to stop
(:func:`mark_stopping`) and deletes it when it stops (:func:`deregister`). A worker that
dies leaves its row: the maintenance leader deletes the rows not beaten for the
``rescue_after`` each records, the worker's own (:func:`prune`; the leader's for a row
written without it), in the transaction, fenced by its term, that rescues the jobs of the
same workers by the same rule (:func:`promised`), so a row outlives its worker's jobs by
at most one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Interval,
    Text,
    bindparam,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, insert

from cyclone._store import executor as _executor
from cyclone._store.executor import const
from cyclone.schema import jobs, workers
from cyclone.states import JobState


@dataclass(frozen=True, slots=True)
class Registration:
    """What a worker records of itself when it starts: its id and what it serves."""

    worker_id: str
    host: str
    pid: int
    concurrency: int
    queues: Sequence[str] | None
    workflows: Sequence[str]
    steps: Sequence[str]
    version: str
    rescue_after: timedelta
    """The silence after which the leader takes its jobs and deletes its row."""

    def params(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "host": self.host,
            "pid": self.pid,
            "concurrency": self.concurrency,
            "queues": None if self.queues is None else list(self.queues),
            "workflows": list(self.workflows),
            "steps": list(self.steps),
            "version": self.version,
            "rescue_after": self.rescue_after,
        }


def _me() -> Any:
    return workers.c.worker_id == bindparam("worker", type_=Text)


def register_worker_stmt() -> Any:
    """Write the worker's row as started now, replacing one of the same id (a Worker
    that serves again after a drain, or whose row a leader pruned while it was frozen)."""
    now = func.now()
    values = {
        "worker_id": bindparam("worker_id", type_=Text),
        "host": bindparam("host", type_=Text),
        "pid": bindparam("pid", type_=Integer),
        "concurrency": bindparam("concurrency", type_=Integer),
        "queues": bindparam("queues", type_=ARRAY(Text)),
        "workflows": bindparam("workflows", type_=ARRAY(Text)),
        "steps": bindparam("steps", type_=ARRAY(Text)),
        "version": bindparam("version", type_=Text),
        "rescue_after": bindparam("rescue_after", type_=Interval),
        "started_at": now,
        "heartbeat_at": now,
        "stopping_at": None,
    }
    stmt = insert(workers).values(values)
    return stmt.on_conflict_do_update(
        index_elements=[workers.c.worker_id],
        set_={name: stmt.excluded[name] for name in values if name != "worker_id"},
    )


def beat_worker_stmt() -> Any:
    """Mark the worker alive now; returns its id, none when its row is gone."""
    return (
        update(workers).where(_me()).values(heartbeat_at=func.now()).returning(workers.c.worker_id)
    )


def mark_stopping_stmt() -> Any:
    """Record that the worker began to stop (the first time only); returns its id."""
    return (
        update(workers)
        .where(_me())
        .values(
            stopping_at=func.coalesce(workers.c.stopping_at, func.now()), heartbeat_at=func.now()
        )
        .returning(workers.c.worker_id)
    )


def deregister_worker_stmt() -> Any:
    """Delete the worker's row."""
    return delete(workers).where(_me())


def promised(worker_id: Any) -> Any:
    """The silence after which the worker ``worker_id`` (a column or an expression) is
    lost: the ``rescue_after`` its row records, or the leader's (``:rescue_after``) when
    it has no row or its row none (written by a cyclone before revision
    cyclone_0026_worker_rescue_after).

    The one rule of the maintenance leader for a worker's row (:func:`prune_workers_stmt`)
    and its running jobs (:func:`cyclone._store.rescue.rescue_jobs_stmt`): a leader with a
    short ``rescue_after`` does not take the jobs of a live worker that promised to beat
    within a longer one, nor leave those of a dead worker with a shorter one waiting.
    """
    own = select(workers.c.rescue_after).where(workers.c.worker_id == worker_id)
    return func.coalesce(own.scalar_subquery(), bindparam("rescue_after", type_=Interval))


def shortest_promise() -> Any:
    """The shortest silence any worker may be judged by (its own or the leader's): a
    bound that lets a statement read only the heartbeats old enough, by their index."""
    shortest = select(func.min(workers.c.rescue_after)).scalar_subquery()
    return func.least(bindparam("rescue_after", type_=Interval), shortest)


def prune_workers_stmt() -> Any:
    """Delete the rows of workers not beaten for the ``rescue_after`` each records (the
    leader's, ``:rescue_after``, for a row without one), but the leader's own
    (``:worker``, alive: it runs the pass); returns their ids.

    The rule of :func:`cyclone._store.rescue.rescue_jobs_stmt` for a job whose worker
    stopped beating (:func:`promised`), applied to the worker itself.
    """
    promise = func.coalesce(workers.c.rescue_after, bindparam("rescue_after", type_=Interval))
    return (
        delete(workers)
        .where(
            workers.c.heartbeat_at < func.now() - promise,
            workers.c.worker_id != bindparam("worker", type_=Text),
        )
        .returning(workers.c.worker_id)
    )


def list_workers_stmt() -> Any:
    """Every registered worker, oldest first, with the count of jobs running under its id.

    The count reads the running jobs through the index of their heartbeats
    (``ix_cyclone_jobs_heartbeat_at``, a job has one exactly while it runs): as many as
    the workers hold, whatever the table's size.
    """
    running = (
        select(jobs.c.worker_id, func.count().label("running"))
        .where(
            jobs.c.heartbeat_at.is_not(None),
            jobs.c.state == const(JobState.RUNNING.value),
            jobs.c.worker_id.is_not(None),
        )
        .group_by(jobs.c.worker_id)
        .subquery("running")
    )
    return (
        select(
            workers.c.worker_id,
            workers.c.host,
            workers.c.pid,
            workers.c.started_at,
            workers.c.heartbeat_at,
            workers.c.concurrency,
            workers.c.queues,
            workers.c.workflows,
            workers.c.steps,
            workers.c.version,
            workers.c.stopping_at,
            func.coalesce(running.c.running, 0),
            workers.c.rescue_after,
            # The clock when the rows are read, after the snapshot: now() is the start of
            # the transaction, which can precede a beat the snapshot already sees.
            func.clock_timestamp(),
        )
        .select_from(workers.outerjoin(running, running.c.worker_id == workers.c.worker_id))
        .order_by(workers.c.started_at, workers.c.worker_id)
    )


_REGISTER = _executor.Compiled(register_worker_stmt())
_BEAT = beat_worker_stmt()
_STOPPING = mark_stopping_stmt()
_DEREGISTER = deregister_worker_stmt()
_PRUNE = prune_workers_stmt()
_LIST = list_workers_stmt()


def register(conn: _executor.Sends, registration: Registration) -> None:
    """Write the worker's row (one statement, in autocommit)."""
    _executor.affected(conn, _REGISTER, registration.params())


def beat(conn: Connection, worker_id: str) -> bool:
    """Mark the worker alive; False when its row is gone (pruned while it was silent)."""
    return _executor.first(conn, _BEAT, {"worker": worker_id}) is not None


def mark_stopping(conn: Connection, worker_id: str) -> bool:
    """Record that the worker began to stop; False when its row is gone."""
    return _executor.first(conn, _STOPPING, {"worker": worker_id}) is not None


def deregister(conn: Connection, worker_id: str) -> None:
    _executor.affected(conn, _DEREGISTER, {"worker": worker_id})


def prune(conn: Connection, rescue_after: timedelta, leader: str) -> list[str]:
    """Delete the rows of workers silent for the ``rescue_after`` each records (this one,
    the leader's, for a row without; never ``leader``'s own row); their ids."""
    return [
        str(worker_id)
        for worker_id in _executor.column(
            conn, _PRUNE, {"rescue_after": rescue_after, "worker": leader}
        )
    ]


def listed(conn: Connection) -> list[_executor.Row]:
    """Every registered worker, oldest first: the columns of ``cyclone_workers`` in table
    order but ``rescue_after``, then the jobs running under its id, its ``rescue_after``
    and the database's clock when read."""
    return _executor.rows(conn, _LIST)
