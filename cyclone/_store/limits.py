"""Flow control's statements: a limit's rows, the claim of limited jobs, and their reads.

A limited job keeps its limit's name and key (``limit_name``, ``limit_key``); the
claim indexes never see it, since a worker leaves the kinds it serves with a limit out
of its ordinary claim, and claims them here instead, one statement per claim:

1. **Lock the keys.** Among the keys of the served limits that have a due job, take
   those with room, least recently served first (``served_at``: fairness across keys),
   ``FOR UPDATE SKIP LOCKED``: two claims never hold one key at once.
2. **Check the count is current.** A Concurrency's room is ``max`` minus the key's
   running jobs, counted in the statement's snapshot. Every claim of a key bumps the
   key row's ``version`` under its lock, and a locked row is read at its newest
   version: a key whose locked version differs from the one in the snapshot was
   claimed from by a transaction the snapshot does not see, so its count may be short,
   and it is skipped this time (the next claim serves it). Otherwise every claim of the
   key is in the snapshot and the count is exact or higher (a job ended since): never
   too low. A Rate's room is ``max`` minus the starts in the key's current window, kept
   on the locked row itself.
3. **Claim** up to the room of each key, the oldest due jobs first, one job per key
   before a second of any key, and bump each key served: ``served_at``, ``version``,
   and for a Rate its window's count.

A job leaving ``running`` (done, failed, retried, rescued, handed back, cancelled)
touches no limit row: the count is of the rows, so it cannot drift.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Engine,
    Float,
    Integer,
    Interval,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    extract,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from cyclone._store import binds as _binds
from cyclone._store import fastpath as _fastpath
from cyclone._store import notify as _notify
from cyclone._store.claim import _CLAIMED_COLUMNS, Claimed, _claimed
from cyclone._store.fastpath import const
from cyclone.schema import jobs, limit_keys, limits, runs
from cyclone.states import JobState, RunState

# -- a limit's rows ------------------------------------------------------------------------


def _limit_values() -> dict[str, Any]:
    return {
        "name": bindparam("name", type_=Text),
        "max": bindparam("max", type_=Integer),
        "per": bindparam("per", type_=Interval),
        "on_limit": bindparam("on_limit", type_=Text),
        "counts": bindparam("counts", type_=Text),
    }


def ensure_key_stmt() -> Any:
    """Create the limit ``:name`` (as defined, unless it exists) and its key ``:key``.

    Both inserts do nothing on a conflict, so an enqueue of a key that exists takes no
    lock on either row.
    """
    made = (
        insert(limits)
        .values(**_limit_values())
        .on_conflict_do_nothing(index_elements=[limits.c.name])
        .returning(limits.c.name)
        .cte("made")
    )
    return (
        insert(limit_keys)
        .values(name=bindparam("name", type_=Text), key=bindparam("key", type_=Text))
        .on_conflict_do_nothing(index_elements=[limit_keys.c.name, limit_keys.c.key])
        .returning(limit_keys.c.name)
        .add_cte(made)
    )


def register_stmt() -> Any:
    """Create or update the limit ``:name`` as a definition gives it (a worker's start).

    A limit an operator set (``set_limit``) keeps its ``max``. Returns what it counts,
    so a definition counting something else under the same name is refused.
    """
    stmt = insert(limits).values(**_limit_values())
    return stmt.on_conflict_do_update(
        index_elements=[limits.c.name],
        set_={
            "max": case((limits.c.set_by_operator, limits.c.max), else_=stmt.excluded.max),
            "per": stmt.excluded.per,
            "on_limit": stmt.excluded.on_limit,
            "updated_at": func.now(),
        },
        where=and_(
            limits.c.counts == stmt.excluded.counts,
            or_(
                and_(~limits.c.set_by_operator, limits.c.max != stmt.excluded.max),
                limits.c.per.is_distinct_from(stmt.excluded.per),
                limits.c.on_limit != stmt.excluded.on_limit,
            ),
        ),
    ).returning(limits.c.counts)


_ENSURE_KEY = _fastpath.Compiled(ensure_key_stmt())
_REGISTER = _fastpath.Compiled(register_stmt())
_COUNTS_OF = _fastpath.Compiled(
    select(limits.c.counts).where(limits.c.name == bindparam("name", type_=Text))
)


def spec_params(
    name: str, max: int, per: timedelta | None, on_limit: str, counts: str
) -> dict[str, Any]:
    return {"name": name, "max": max, "per": per, "on_limit": on_limit, "counts": counts}


def ensure_key(conn: _fastpath.Executor, params: dict[str, Any], key: str) -> None:
    """Make sure the limit of ``params`` and its ``key`` have their rows (an enqueue's first)."""
    conn.execute(_ENSURE_KEY, {**params, "key": key})


def register(conn: _fastpath.Executor, params: dict[str, Any]) -> str | None:
    """Write the limit of ``params`` as defined; what the stored limit counts."""
    rows = conn.execute(_REGISTER, params)
    if rows:
        return str(rows[0][0])
    found = conn.execute(_COUNTS_OF, params)
    return str(found[0][0]) if found else None


# -- the claim of limited jobs ---------------------------------------------------------


def _window(per: Any) -> Any:
    """The start of the current window of a rate ``per``: a multiple of it since the epoch."""
    seconds = extract("epoch", per)
    return func.to_timestamp(func.floor(extract("epoch", func.now()) / seconds) * seconds)


def _due(table: Any, name: Any, key: Any, queues: tuple[str, ...] | None) -> tuple[Any, ...]:
    """An available job of the limit ``name`` and ``key``, due, of ``queues`` (None: any)."""
    return (
        table.c.limit_name == name,
        table.c.limit_key == key,
        table.c.state == const(JobState.AVAILABLE.value),
        table.c.scheduled_at <= func.now(),
        or_(table.c.deadline.is_(None), table.c.deadline > func.now()),
        true() if queues is None else table.c.queue.in_([const(q) for q in queues]),
    )


def _running_of(name: Any, key: Any) -> Any:
    """Running jobs of ``name`` and ``key`` in the snapshot (``ix_cyclone_jobs_gated_running``)."""
    r = jobs.alias("r")
    return (
        select(func.count())
        .where(
            r.c.limit_name == name,
            r.c.limit_key == key,
            r.c.state == const(JobState.RUNNING.value),
        )
        .scalar_subquery()
    )


def claim_gated_stmt(names: tuple[str, ...], queues: tuple[str, ...] | None, limit: int) -> Any:
    """Claim up to ``limit`` due jobs of the limits ``names`` for ``:me`` (see the module)."""
    top: Any = literal_column(str(int(limit)))
    k, lim = limit_keys, limits
    window = _window(lim.c.per)
    used = case(
        (lim.c.per.is_(None), _running_of(k.c.name, k.c.key)),
        (k.c.window_start == window, k.c.window_count),
        else_=const(0, Integer),
    )
    a = jobs.alias("a")
    locked = (
        select(
            k.c.name,
            k.c.key,
            k.c.version,
            k.c.served_at,
            (lim.c.max - used).label("room"),
            case((lim.c.per.is_not(None), window)).label("win"),
        )
        .join_from(k, lim, lim.c.name == k.c.name)
        .where(
            k.c.name.in_([const(n) for n in names]),
            lim.c.max - used > const(0, Integer),
            exists(select(a.c.id).where(*_due(a, k.c.name, k.c.key, queues))),
        )
        .order_by(k.c.served_at, k.c.name, k.c.key)
        .limit(top)
        .with_for_update(of=k, skip_locked=True)
        .cte("locked")
    )
    snap = limit_keys.alias("snap")
    in_snapshot = (
        select(snap.c.version)
        .where(snap.c.name == locked.c.name, snap.c.key == locked.c.key)
        .scalar_subquery()
    )
    c = jobs.alias("c")
    cand = (
        select(c.c.id, c.c.priority, c.c.scheduled_at)
        .where(*_due(c, locked.c.name, locked.c.key, queues))
        .order_by(c.c.priority, c.c.scheduled_at, c.c.id)
        .limit(func.least(locked.c.room, top))
        .with_for_update(skip_locked=True)
        .lateral("cand")
    )
    rank = func.row_number().over(
        partition_by=(locked.c.name, locked.c.key),
        order_by=(cand.c.priority, cand.c.scheduled_at, cand.c.id),
    )
    ranked = (
        select(cand.c.id, rank.label("rk"), locked.c.served_at, cand.c.priority)
        .select_from(locked)
        .join(cand, true())
        .where(locked.c.version == in_snapshot)
        .subquery("ranked")
    )
    chosen = (
        select(ranked.c.id)
        .order_by(ranked.c.rk, ranked.c.served_at, ranked.c.priority, ranked.c.id)
        .limit(top)
        .cte("chosen")
    )
    claimed = (
        update(jobs)
        .where(jobs.c.id.in_(select(chosen.c.id).scalar_subquery()))
        .values(
            state=const(JobState.RUNNING.value),
            attempt=jobs.c.attempt + 1,
            lease=jobs.c.lease + 1,
            worker_id=bindparam("me", type_=Text),
            attempted_at=func.now(),
            heartbeat_at=func.now(),
        )
        .returning(*_CLAIMED_COLUMNS, jobs.c.limit_name, jobs.c.limit_key)
        .cte("claimed")
    )
    per_key = (
        select(claimed.c.limit_name, claimed.c.limit_key, func.count().label("n"))
        .group_by(claimed.c.limit_name, claimed.c.limit_key)
        .subquery("per_key")
    )
    served = (
        update(limit_keys)
        .where(
            limit_keys.c.name == per_key.c.limit_name,
            limit_keys.c.key == per_key.c.limit_key,
            locked.c.name == per_key.c.limit_name,
            locked.c.key == per_key.c.limit_key,
        )
        .values(
            served_at=func.clock_timestamp(),
            version=limit_keys.c.version + 1,
            window_start=locked.c.win,
            window_count=case(
                (locked.c.win.is_(None), const(0, Integer)),
                (
                    limit_keys.c.window_start == locked.c.win,
                    limit_keys.c.window_count + per_key.c.n,
                ),
                else_=per_key.c.n,
            ),
        )
        .returning(limit_keys.c.name)
        .cte("served")
    )
    stmt = select(
        cast(null(), Integer),
        claimed.c.id,
        claimed.c.run_id,
        claimed.c.workflow,
        claimed.c.kind,
        claimed.c.queue,
        claimed.c.attempt,
        claimed.c.lease,
        claimed.c.max_attempts,
        claimed.c.deadline,
        cast(claimed.c.args, Text),
        cast(null(), Text),
        claimed.c.unique_key,
        claimed.c.trace_context,
        select(func.count()).select_from(served).scalar_subquery(),
    ).order_by(claimed.c.priority, claimed.c.scheduled_at, claimed.c.id)
    return stmt


@functools.lru_cache(maxsize=256)
def _fast_claim_gated(
    names: tuple[str, ...], queues: tuple[str, ...] | None, limit: int
) -> _fastpath.Compiled:
    return _fastpath.Compiled(claim_gated_stmt(names, queues, limit))


def claim_gated(
    conn: _fastpath.Executor,
    *,
    worker_id: str,
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    limit: int,
) -> list[Claimed]:
    """Claim up to ``limit`` due jobs of the limits ``names`` in one autocommit statement."""
    if limit <= 0 or not names:
        return []
    rows = conn.execute(_fast_claim_gated(names, queues, limit), {"me": worker_id})
    return [_claimed(row) for row in rows]


def next_gated_due_stmt(names: tuple[str, ...], queues: tuple[str, ...] | None) -> Any:
    """Seconds until a limited job of ``names`` may next start, or NULL: a job scheduled
    later falls due, or the next window of a rate whose current window is full."""
    a = jobs.alias("a")
    k, lim = limit_keys, limits
    window = _window(lim.c.per)
    scheduled = (
        select(func.min(a.c.scheduled_at))
        .where(
            a.c.limit_name.in_([const(n) for n in names]),
            a.c.state == const(JobState.AVAILABLE.value),
            a.c.scheduled_at > func.now(),
            true() if queues is None else a.c.queue.in_([const(q) for q in queues]),
        )
        .scalar_subquery()
    )
    b = jobs.alias("b")
    next_window = (
        select(func.min(window + lim.c.per))
        .join_from(k, lim, lim.c.name == k.c.name)
        .where(
            k.c.name.in_([const(n) for n in names]),
            lim.c.per.is_not(None),
            k.c.window_start == window,
            k.c.window_count >= lim.c.max,
            exists(select(b.c.id).where(*_due(b, k.c.name, k.c.key, queues))),
        )
        .scalar_subquery()
    )
    return select(extract("epoch", func.least(scheduled, next_window) - func.now()).cast(Float))


@functools.lru_cache(maxsize=64)
def _fast_next_due(names: tuple[str, ...], queues: tuple[str, ...] | None) -> _fastpath.Compiled:
    return _fastpath.Compiled(next_gated_due_stmt(names, queues))


def seconds_until_gated_due(
    conn: _fastpath.Executor, names: tuple[str, ...], queues: tuple[str, ...] | None
) -> float | None:
    """Seconds until a limited job of ``names`` may start, None when none waits on time."""
    if not names:
        return None
    rows = conn.execute(_fast_next_due(names, queues), {})
    value = rows[0][0] if rows else None
    return None if value is None else max(0.0, float(value))


# -- the operator's reads and writes ---------------------------------------------------


def _job_counts() -> Any:
    """Per limit and key: jobs running and jobs waiting (available: due or not)."""
    return (
        select(
            jobs.c.limit_name.label("name"),
            jobs.c.limit_key.label("key"),
            func.count().filter(jobs.c.state == const(JobState.RUNNING.value)).label("running"),
            func.count().filter(jobs.c.state == const(JobState.AVAILABLE.value)).label("waiting"),
        )
        .where(
            jobs.c.limit_name.is_not(None),
            jobs.c.state.in_([const(JobState.RUNNING.value), const(JobState.AVAILABLE.value)]),
        )
        .group_by(jobs.c.limit_name, jobs.c.limit_key)
    )


def _run_counts() -> Any:
    """Per limit and key: runs in progress, and runs held back."""
    held = runs.c.start_at == literal_column("'infinity'::timestamptz")
    return (
        select(
            runs.c.limit_name.label("name"),
            runs.c.limit_key.label("key"),
            func.count().filter(~held).label("running"),
            func.count().filter(held).label("waiting"),
        )
        .where(runs.c.limit_name.is_not(None), runs.c.state == const(RunState.RUNNING.value))
        .group_by(runs.c.limit_name, runs.c.limit_key)
    )


def list_limits_stmt() -> Any:
    """Every limit with each key that has something running or waiting."""
    counted = _job_counts().union_all(_run_counts()).subquery("counted")
    return (
        select(
            limits.c.name,
            limits.c.max,
            limits.c.per,
            limits.c.counts,
            limits.c.on_limit,
            limits.c.set_by_operator,
            counted.c.key,
            func.coalesce(counted.c.running, 0),
            func.coalesce(counted.c.waiting, 0),
        )
        .select_from(limits)
        .outerjoin(counted, counted.c.name == limits.c.name)
        .order_by(limits.c.name, counted.c.key)
    )


_LIST = list_limits_stmt()
_SET_LIMIT = (
    update(limits)
    .where(limits.c.name == bindparam("b_name", type_=Text))
    .values(max=bindparam("b_max", type_=Integer), set_by_operator=true(), updated_at=func.now())
    .returning(limits.c.name, func.pg_notify(const(_notify.JOBS_AVAILABLE), const("")))
)


def list_limits(engine: Engine) -> Sequence[Any]:
    """Rows ``(name, max, per, counts, on_limit, set_by_operator, key, running, waiting)``."""
    with _binds.autocommit(engine) as conn:
        return list(conn.execute(_LIST).all())


def set_limit(engine: Engine, name: str, max: int) -> bool:
    """Set the limit ``name``'s ``max`` (kept over its definitions' from now on); found?"""
    with _binds.autocommit(engine) as conn:
        return conn.execute(_SET_LIMIT, {"b_name": name, "b_max": max}).first() is not None
