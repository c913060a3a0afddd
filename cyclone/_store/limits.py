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
   and it is skipped this time. The statement counts the keys it skipped, locked or
   claimed from since its snapshot, and the worker claims again shortly for them.
   Otherwise every claim of the key is in the snapshot and the count is exact or higher
   (a job ended since): never too low. A Rate's room is ``max`` minus the starts in the
   key's current window, kept on the locked row itself.
3. **Claim** up to the room of each key, the oldest due jobs first, one job per key
   before a second of any key, and bump each key served: ``served_at``, ``version``
   (by the jobs claimed from it, so it counts at least a Rate window's starts), and for a
   Rate its window's count.

A job leaving ``running`` (done, failed, retried, rescued, handed back, cancelled)
touches no limit row: the count is of the rows, so it cannot drift.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, NamedTuple

from sqlalchemy import (
    BigInteger,
    Engine,
    Float,
    Integer,
    Interval,
    Text,
    Uuid,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    extract,
    false,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, insert

from cyclone import _observe
from cyclone._store import binds as _binds
from cyclone._store import completion as _completion
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from cyclone._store import queues as _queues
from cyclone._store.claim import (
    _CLAIMED_COLUMNS,
    Claimed,
    _claimed,
    claimed_job_columns,
    claimed_step_columns,
    unlimited_standalone,
    with_runs,
)
from cyclone._store.executor import const, one_of
from cyclone.schema import jobs, limit_keys, limits, runs
from cyclone.states import JobState, RunState

_INFINITY: Any = literal_column("'infinity'::timestamptz")

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


_ENSURE_KEY = _executor.Compiled(ensure_key_stmt())
_REGISTER = _executor.Compiled(register_stmt())
_COUNTS_OF = _executor.Compiled(
    select(limits.c.counts).where(limits.c.name == bindparam("name", type_=Text))
)


def spec_params(
    name: str, max: int, per: timedelta | None, on_limit: str, counts: str
) -> dict[str, Any]:
    return {"name": name, "max": max, "per": per, "on_limit": on_limit, "counts": counts}


def ensure_key(conn: _executor.Executor, params: dict[str, Any], key: str) -> None:
    """Make sure the limit of ``params`` and its ``key`` have their rows (an enqueue's first)."""
    conn.rows(_ENSURE_KEY, {**params, "key": key})


def register(conn: _executor.Executor, params: dict[str, Any]) -> str | None:
    """Write the limit of ``params`` as defined; what the stored limit counts."""
    rows = conn.rows(_REGISTER, params)
    if rows:
        return str(rows[0][0])
    found = conn.rows(_COUNTS_OF, params)
    return str(found[0][0]) if found else None


# -- the claim of limited jobs ---------------------------------------------------------


def _window(per: Any) -> Any:
    """The start of the current window of a rate ``per``: a multiple of it since the epoch."""
    seconds = extract("epoch", per)
    return func.to_timestamp(func.floor(extract("epoch", func.now()) / seconds) * seconds)


class Served(NamedTuple):
    """What a worker runs: the step kinds of its standalone jobs and its workflows.

    A limit's name may be shared by definitions that different workers serve, so every
    read of a limit's jobs for a worker keeps to the jobs it can run: another's job
    claimed would fail here as a kind not defined.
    """

    kinds: tuple[str, ...]
    workflows: tuple[str, ...]


def _of_served(table: Any, served: Served) -> Any:
    """A job ``served`` covers: a standalone job of its kinds, or a step of its workflows."""
    return or_(
        and_(table.c.workflow.is_(None), one_of(table.c.kind, served.kinds)),
        one_of(table.c.workflow, served.workflows),
    )


def _due(
    table: Any,
    name: Any,
    key: Any,
    queues: tuple[str, ...] | None,
    served: Served,
    steps: bool = False,
) -> tuple[Any, ...]:
    """An available job of the limit ``name`` and ``key`` that ``served`` covers, due, of
    ``queues`` (None: any), in a queue not paused; with ``steps`` (workflow steps are
    served), of no run or of a running run (its state read by a probe of its primary key,
    as the ordinary claim does)."""
    run_check: Any = true()
    if steps:
        run_state = select(runs.c.state).where(runs.c.id == table.c.run_id).scalar_subquery()
        run_check = or_(table.c.run_id.is_(None), run_state == const(RunState.RUNNING.value))
    return (
        table.c.limit_name == name,
        table.c.limit_key == key,
        table.c.state == const(JobState.AVAILABLE.value),
        table.c.scheduled_at <= func.now(),
        or_(table.c.deadline.is_(None), table.c.deadline > func.now()),
        true() if queues is None else one_of(table.c.queue, queues),
        _of_served(table, served),
        _queues.served(table.c.queue),
        run_check,
    )


def _probe(found: Any) -> Any:
    """``EXISTS (found)``, a probe per outer row (a limit's key) that stops at its first row.

    ``OFFSET 0`` keeps it a probe. Without it, the planner may turn the ``EXISTS`` into a
    join that collects the distinct keys of every waiting row first, which a plan made
    when few rows waited does: each statement then read every job (or held run) waiting
    under the limit, and a key with thousands waiting was served at a few hundred jobs a
    second."""
    return exists(found.offset(literal_column("0")))


FRONT_KEYS = 16
"""How many of a limit's keys, least recently served first, a claim of ``top`` keys
reads (twice ``top``, and at least this many) before it looks among the keys with
waiting work alone (:func:`_in_turn`)."""


def _pair(table: Any) -> Any:
    """``(limit_name, limit_key)``, compared as a row: alone on those columns, a row
    comparison is where the index scan starts. Beside ``limit_name = :name`` it is only a
    filter, and each step of a walk started at the limit's first key (0.07 ms a step with
    10,000 keys waiting)."""
    return tuple_(table.c.limit_name, table.c.limit_key)


def _gated_jobs(table: Any) -> tuple[Any, ...]:
    """An available job with a limit (the predicate of ``ix_cyclone_jobs_gated``)."""
    return (*_available_jobs(table), table.c.limit_name.is_not(None))


def _keys_of(
    names: tuple[str, ...], label: str, table: Any = jobs, waiting: Any = _gated_jobs
) -> Any:
    """The distinct keys of the limits ``names`` that ``table``'s rows ``waiting(alias)``
    keep (available jobs: :func:`_gated_jobs`), as a CTE (columns ``n``, ``k``): per
    limit, a recursive walk that takes the least pair of a limit and a key above the
    last, one descent of the index those rows are a range of per key (a loose index
    scan). Read as far as its reader reads."""

    def least(after: Any) -> Any:
        probe = table.alias()
        return (
            select(probe.c.limit_name.label("n"), probe.c.limit_key.label("k"))
            .where(*waiting(probe), probe.c.limit_name.is_not(None), after(_pair(probe)))
            .order_by(probe.c.limit_name, probe.c.limit_key)
            .limit(const(1, Integer))
        )

    walks = []
    for i, name in enumerate(names):
        first = least(lambda pair, name=name: pair >= tuple_(const(name), const("")))
        walk = first.cte(f"{label}_{i}", recursive=True)
        step = least(lambda pair, walk=walk: pair > tuple_(walk.c.n, walk.c.k)).lateral(
            f"{label}_{i}_next"
        )
        walk = walk.union_all(
            select(step.c.n, step.c.k)
            .select_from(walk)
            .join(step, true())
            .where(walk.c.n == const(name))
        )
        walks.append(select(walk.c.n, walk.c.k).where(walk.c.n == const(name)))
    return union_all(*walks).cte(label) if len(walks) > 1 else walks[0].cte(label)


def _among_keys(k: Any, names: tuple[str, ...], found: Any) -> Any:
    """A key row of ``k`` among the keys ``found`` (a :func:`_keys_of`): each limit's
    keys as an array, so that the rows are found by primary key."""
    return _keyed(k, names, found.c.n, found.c.k)


def _keyed(k: Any, names: tuple[str, ...], name: Any, key: Any) -> Any:
    """A key row of ``k`` whose name and key are a row's ``name`` and ``key`` (columns of
    one table or CTE): each limit's keys as an array, so that the rows are found by
    primary key, not joined (a plan may hash the few rows and read every key)."""
    return or_(
        *(
            and_(
                k.c.name == const(each),
                k.c.key
                == any_(
                    func.array(
                        select(key).where(name == const(each)).scalar_subquery(),
                        type_=ARRAY(Text),
                    )
                ),
            )
            for each in names
        )
    )


def _front_bound(names: tuple[str, ...], top: int, label: str) -> Any:
    """The ``served_at`` of the last key of the front of the limits ``names`` for a claim
    of ``top`` keys (:data:`FRONT_KEYS`), least recently served first (a CTE read once);
    NULL when they have fewer keys."""
    front = max(FRONT_KEYS, 2 * top)
    kb = limit_keys.alias(f"{label}_kb")
    last_front = (
        select(kb.c.served_at)
        .where(one_of(kb.c.name, names))
        .order_by(kb.c.served_at, kb.c.name, kb.c.key)
        .offset(literal_column(str(front - 1)))
        .limit(literal_column("1"))
        .cte(label)
    )
    return select(last_front.c.served_at).scalar_subquery()


def _in_front(k: Any, bound: Any) -> Any:
    """A key row of ``k`` in the front (served at or before its ``bound``, or any when the
    limits have no more keys than the front)."""
    return k.c.served_at <= func.coalesce(bound, _INFINITY)


def _served_at_unindexed(k: Any) -> Any:
    """``served_at`` of ``k`` as an expression no index has: compared or ordered on the
    column, a plan read the keys' ``(name, served_at, key)`` index over every key served
    since the bound, testing each against the waiting ones, instead of finding those by
    primary key."""
    return k.c.served_at + literal_column("interval '0 s'")


def _past_front(k: Any, bound: Any) -> tuple[Any, ...]:
    """A key row of ``k`` served after the front's ``bound``, which exists."""
    return (bound.is_not(None), _served_at_unindexed(k) > bound)


def _in_turn(
    build: Any,
    k: Any,
    names: tuple[str, ...],
    found: Any,
    bound: Any,
    top: Any,
    label: str,
    lock: bool = True,
) -> Any:
    """Up to ``top`` keys of ``build(*conditions)`` (a select of the key rows ``k`` of the
    limits ``names`` with work), least recently served first, locked ``FOR UPDATE SKIP
    LOCKED`` (with ``lock``; without it, read as they are in the snapshot, locked or not).

    Keys that are done with keep their row, and the oldest ``served_at``: read in that
    order alone, every claim passed over every key that ever had work (a limit keyed by
    customer read them all, 20,000 of them taking 30 s a claim). So only the front of
    that order is read so (its keys up to ``bound``, a :func:`_front_bound`); if it holds
    fewer than ``top`` keys to take, the rest are looked for among the keys with waiting
    work (``found``, a :func:`_keys_of`), which costs a probe per such key, in the same
    order. Both parts together are the first ``top`` keys in order, exactly."""

    def locked(stmt: Any) -> Any:
        return stmt.with_for_update(of=k, skip_locked=True) if lock else stmt

    front = locked(
        build(_in_front(k, bound)).order_by(k.c.served_at, k.c.name, k.c.key).limit(top)
    ).cte(f"{label}_front")
    taken = select(func.count()).select_from(front).scalar_subquery()
    rest = locked(
        build(taken < top, *_past_front(k, bound), _among_keys(k, names, found))
        .order_by(_served_at_unindexed(k), k.c.name, k.c.key)
        .limit(top - taken)
    ).cte(f"{label}_rest")
    return union_all(select(front), select(rest))


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


def _used(k: Any, lim: Any) -> Any:
    """What a key of ``k`` (its limit ``lim``) has used: running jobs for a Concurrency, the
    current window's starts for a Rate."""
    window = _window(lim.c.per)
    return case(
        (lim.c.per.is_(None), _running_of(k.c.name, k.c.key)),
        (k.c.window_start == window, k.c.window_count),
        else_=const(0, Integer),
    )


def claim_gated_stmt(
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    limit: int,
    steps: bool = False,
    completing: bool = False,
    paired: bool = False,
) -> Any:
    """Claim up to ``limit`` due jobs of the limits ``names`` that ``served`` covers, for
    ``:me`` (see the module).

    With ``paired`` (a served definition has a Rate with its Concurrency), each candidate
    also passes its Rate (``rate_name``, ``rate_key``; for a job of a Rate alone, its own
    limit): the rate keys are locked too, ``SKIP LOCKED`` (a candidate whose rate key is
    held elsewhere waits for the next claim), at most their window's room of candidates
    pass per rate key, and one update bumps every key served, each once.

    With ``steps`` (a limit of ``names`` is a workflow step's), a claimed step returns its
    run's input and its upstream outputs, as the ordinary claim does. ``completing`` first
    records the successes in ``:items``, as the ordinary claim does (their runs locked
    first), for a worker with nothing but limited jobs to claim: one statement a loop.
    The statement then returns at least one row, whose first column holds the ids of the
    jobs recorded. A job completed here is still running in the statement's snapshot, so
    the count of its key is too high this time, never too low.
    """
    runs_locked = _completion.runs_locked_first() if completing else true()
    top: Any = literal_column(str(int(limit)))
    k, lim = limit_keys, limits
    window = _window(lim.c.per)
    used = _used(k, lim)
    a = jobs.alias("a")

    def keys(*conditions: Any) -> Any:
        return (
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
                runs_locked,
                one_of(k.c.name, names),
                *conditions,
                lim.c.max - used > const(0, Integer),
                _probe(select(a.c.id).where(*_due(a, k.c.name, k.c.key, queues, served, steps))),
            )
        )

    found = _keys_of(names, "waiting_keys")
    bound = _front_bound(names, limit, "front_bound")
    locked = _in_turn(keys, k, names, found, bound, top, "locked").cte("locked")
    snap = limit_keys.alias("snap")
    in_snapshot = (
        select(snap.c.version)
        .where(snap.c.name == locked.c.name, snap.c.key == locked.c.key)
        .scalar_subquery()
    )
    c = jobs.alias("c")
    cand = (
        select(c.c.id, c.c.priority, c.c.scheduled_at, c.c.rate_name, c.c.rate_key)
        .where(*_due(c, locked.c.name, locked.c.key, queues, served, steps))
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
    held_gates: Any = const(0, Integer)
    if paired:
        ranked, held_gates = _rate_gated(locked, cand, rank, in_snapshot)
    chosen = (
        select(ranked.c.id)
        .order_by(ranked.c.rk, ranked.c.served_at, ranked.c.priority, ranked.c.id)
        .limit(top)
        .cte("chosen")
    )
    claimed = (
        update(jobs)
        .where(jobs.c.id == chosen.c.id)
        .values(
            state=const(JobState.RUNNING.value),
            attempt=jobs.c.attempt + 1,
            lease=jobs.c.lease + 1,
            worker_id=bindparam("me", type_=Text),
            attempted_at=func.now(),
            heartbeat_at=func.now(),
        )
        .returning(*_CLAIMED_COLUMNS, jobs.c.limit_name, jobs.c.limit_key, *_rate_columns(paired))
        .cte("claimed")
    )
    bumped = _served_paired(claimed) if paired else _served(claimed, locked)
    served_count = select(func.count()).select_from(bumped).scalar_subquery()
    contended = (
        _contended(names, queues, served, steps, top, locked, in_snapshot, found, bound)
        + held_gates
    )
    return _gated_result(claimed, served_count, contended, steps, completing, runs_locked, top)


def _contended(
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    steps: bool,
    top: Any,
    locked: Any,
    in_snapshot: Any,
    found: Any,
    bound: Any,
) -> Any:
    """How many keys with room and a due job the claim could not serve this time: locked
    by another claim (``SKIP LOCKED``), or claimed from since its snapshot. Their jobs are
    for the next claim, which the worker makes at once rather than at its poll: a NOTIFY
    that woke two workers for one key woke the one that lost the race for nothing.

    Read as :func:`_in_turn` reads them: the front's keys, then, past ``bound``, those
    among the keys with waiting jobs (``found``), as far as needed."""
    k, lim = limit_keys.alias("ek"), limits.alias("el")
    used = _used(k, lim)
    e = jobs.alias("e")

    def eligible(*conditions: Any) -> Any:
        return (
            select(k.c.name)
            .join_from(k, lim, lim.c.name == k.c.name)
            .where(
                *conditions,
                lim.c.max - used > const(0, Integer),
                _probe(select(e.c.id).where(*_due(e, k.c.name, k.c.key, queues, served, steps))),
            )
        )

    in_front = (
        eligible(one_of(k.c.name, names), _in_front(k, bound)).limit(top).cte("eligible_front")
    )
    seen_in_front = select(func.count()).select_from(in_front).scalar_subquery()
    open_key = (
        eligible(k.c.name == found.c.n, k.c.key == found.c.k, *_past_front(k, bound))
        .offset(literal_column("0"))
        .lateral("open_key")
    )
    past_front = (
        select(func.count())
        .select_from(
            select(open_key.c.name)
            .select_from(found)
            .join(open_key, true())
            .where(bound.is_not(None), seen_in_front < top)
            .limit(top)
            .subquery("eligible_past_front")
        )
        .scalar_subquery()
    )
    seen = func.least(seen_in_front + past_front, top)
    current = select(func.count()).select_from(locked).where(locked.c.version == in_snapshot)
    return seen - current.scalar_subquery()


def _rate_columns(paired: bool) -> tuple[Any, ...]:
    return (jobs.c.rate_name, jobs.c.rate_key) if paired else ()


def _rate_gated(locked: Any, cand: Any, rank: Any, in_snapshot: Any) -> tuple[Any, Any]:
    """The candidates of ``locked`` keys that their Rate lets start: per rate key (the
    job's ``rate_name``, ``rate_key``, or its own key for a Rate alone), locked ``FOR
    UPDATE SKIP LOCKED`` and read at its newest version, at most its window's room.

    Also how many of those rate keys, with room in their window, it skipped because
    another transaction held them (another worker's claim): contended, as
    :func:`_contended` counts the limits' own keys. Nothing rings when that transaction
    ends, and the window being open, nothing falls due either: the worker claims again
    shortly instead of sleeping until its poll."""
    is_rate = locked.c.win.is_not(None)
    ranked_all = (
        select(
            cand.c.id,
            rank.label("rk"),
            locked.c.served_at,
            cand.c.priority,
            func.coalesce(cand.c.rate_name, case((is_rate, locked.c.name))).label("gn"),
            func.coalesce(cand.c.rate_key, case((is_rate, locked.c.key))).label("gk"),
        )
        .select_from(locked)
        .join(cand, true())
        .where(locked.c.version == in_snapshot)
        .cte("ranked_all")
    )
    k2, lim2 = limit_keys.alias("gate_key"), limits.alias("gate_limit")
    window2 = _window(lim2.c.per)
    gates = (
        select(
            k2.c.name,
            k2.c.key,
            (
                lim2.c.max
                - case((k2.c.window_start == window2, k2.c.window_count), else_=const(0, Integer))
            ).label("room"),
        )
        .join_from(k2, lim2, lim2.c.name == k2.c.name)
        .where(
            tuple_(k2.c.name, k2.c.key).in_(
                select(ranked_all.c.gn, ranked_all.c.gk).where(ranked_all.c.gn.is_not(None))
            )
        )
        .with_for_update(of=k2, skip_locked=True)
        .cte("gates")
    )
    rank2 = func.row_number().over(
        partition_by=(ranked_all.c.gn, ranked_all.c.gk),
        order_by=(ranked_all.c.rk, ranked_all.c.served_at, ranked_all.c.priority, ranked_all.c.id),
    )
    gated = (
        select(
            ranked_all.c.id,
            ranked_all.c.rk,
            ranked_all.c.served_at,
            ranked_all.c.priority,
            ranked_all.c.gn,
            rank2.label("rk2"),
            gates.c.room,
        )
        .select_from(
            ranked_all.outerjoin(
                gates, and_(gates.c.name == ranked_all.c.gn, gates.c.key == ranked_all.c.gk)
            )
        )
        .subquery("gated")
    )
    wanted = (
        select(ranked_all.c.gn, ranked_all.c.gk)
        .where(ranked_all.c.gn.is_not(None))
        .distinct()
        .subquery("wanted_gates")
    )
    k3, lim3 = limit_keys.alias("seen_gate"), limits.alias("seen_limit")
    window3 = _window(lim3.c.per)
    with_room = (
        select(k3.c.name)
        .join_from(k3, lim3, lim3.c.name == k3.c.name)
        .where(
            k3.c.name == wanted.c.gn,
            k3.c.key == wanted.c.gk,
            lim3.c.max
            > case((k3.c.window_start == window3, k3.c.window_count), else_=const(0, Integer)),
        )
        .exists()
    )
    taken = (
        select(gates.c.name).where(gates.c.name == wanted.c.gn, gates.c.key == wanted.c.gk).exists()
    )
    held = select(func.count()).select_from(wanted).where(~taken, with_room).scalar_subquery()
    ranked = (
        select(gated.c.id, gated.c.rk, gated.c.served_at, gated.c.priority)
        .where(or_(gated.c.gn.is_(None), gated.c.rk2 <= gated.c.room))
        .subquery("ranked")
    )
    return ranked, held


def _served_paired(claimed: Any) -> Any:
    """Bump every key the claim took from, each once: a job's own key and its Rate's."""
    both = union_all(
        select(claimed.c.limit_name.label("name"), claimed.c.limit_key.label("key")),
        select(claimed.c.rate_name, claimed.c.rate_key).where(claimed.c.rate_name.is_not(None)),
    ).subquery("both_keys")
    per_key = (
        select(both.c.name, both.c.key, func.count().label("n"))
        .group_by(both.c.name, both.c.key)
        .subquery("per_key")
    )
    win = case((limits.c.per.is_not(None), _window(limits.c.per)))
    return (
        update(limit_keys)
        .where(
            limit_keys.c.name == per_key.c.name,
            limit_keys.c.key == per_key.c.key,
            limits.c.name == limit_keys.c.name,
        )
        .values(
            served_at=func.clock_timestamp(),
            version=limit_keys.c.version + per_key.c.n,
            window_start=win,
            window_count=case(
                (limits.c.per.is_(None), const(0, Integer)),
                (limit_keys.c.window_start == win, limit_keys.c.window_count + per_key.c.n),
                else_=per_key.c.n,
            ),
        )
        .returning(limit_keys.c.name)
        .cte("served")
    )


def _served(claimed: Any, locked: Any) -> Any:
    """Bump each key the claim took from: ``served_at``, ``version``, a rate's window."""
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
            version=limit_keys.c.version + per_key.c.n,
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
    return served


def _gated_result(
    claimed: Any,
    served_count: Any,
    contended: Any,
    steps: bool,
    completing: bool,
    runs_locked: Any,
    top: Any,
) -> Any:
    """The limited claim's rows, as the ordinary claim returns them (see claim_gated_stmt),
    and at least one: its last column counts the keys it could not serve (:func:`_contended`)."""
    recorded: Any = cast(null(), ARRAY(BigInteger))
    extra: tuple[Any, ...] = ()
    if completing:
        done, *rest = _completion.complete_jobs_ctes(runs_locked)
        extra = tuple(rest)
        recorded = select(func.array_agg(done.c.id)).scalar_subquery()
    if not steps:
        stmt = select(
            recorded,
            *claimed_job_columns(claimed),
            cast(claimed.c.args, Text),
            cast(null(), Text),
            claimed.c.unique_key,
            claimed.c.trace_context,
            served_count,
            claimed.c.item,
            claimed.c.limit_name,
            claimed.c.limit_key,
            contended,
        )
        source: Any = claimed
    else:
        stmt = select(
            recorded,
            *claimed_job_columns(claimed),
            *claimed_step_columns(claimed),
            served_count,
            claimed.c.item,
            claimed.c.limit_name,
            claimed.c.limit_key,
            contended,
        )
        source = with_runs(claimed)
    one = select(const(1, Integer).label("one")).subquery("one")
    source = one.outerjoin(source, true())
    for cte in extra:
        stmt = stmt.add_cte(cte)
    return stmt.select_from(source).order_by(
        claimed.c.priority, claimed.c.scheduled_at, claimed.c.id
    )


def _slotted(row: Sequence[Any]) -> Claimed:
    """A limited claim's row: the job, with the limit name and key of its slot."""
    return dataclasses.replace(_claimed(row), slot=(row[-3], row[-2]))


@functools.lru_cache(maxsize=256)
def _fast_claim_gated(
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    limit: int,
    steps: bool,
    completing: bool,
    paired: bool,
) -> _executor.Compiled:
    return _executor.Compiled(
        claim_gated_stmt(names, queues, served, limit, steps, completing, paired)
    )


@_observe.claims
def claim_gated(
    conn: _executor.Executor,
    *,
    worker_id: str,
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    limit: int,
    steps: bool = False,
    paired: bool = False,
    contended: list[int] | None = None,
) -> list[Claimed]:
    """Claim up to ``limit`` due jobs of the limits ``names`` that ``served`` covers, in
    one autocommit statement (``steps``: some are workflow steps). ``contended`` is
    appended how many keys with room and a due job it could not serve (another claim
    held or had just claimed from them): the next claim can."""
    if limit <= 0 or not names:
        return []
    rows = conn.rows(
        _fast_claim_gated(names, queues, served, limit, steps, False, paired), {"me": worker_id}
    )
    if contended is not None and rows:
        contended.append(int(rows[0][-1]))
    return [_slotted(row) for row in rows if row[1] is not None]


@_observe.claims
def record_and_claim_gated(
    conn: _executor.Executor,
    *,
    worker_id: str,
    successes: Sequence[_completion.Success],
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    limit: int,
    steps: bool = False,
    paired: bool = False,
    contended: list[int] | None = None,
) -> tuple[set[int], list[Claimed]]:
    """Record ``successes`` and claim up to ``limit`` limited jobs in one autocommit
    statement: the ids of the successes recorded (the others were refused), the jobs.
    Its claim sees the jobs it records still running: the slots they free are for the
    next claim. ``contended`` as for :func:`claim_gated`."""
    rows = conn.rows(
        _fast_claim_gated(names, queues, served, max(0, limit), steps, True, paired),
        {"me": worker_id, "items": _completion.items_payload(successes)},
    )
    if contended is not None and rows:
        contended.append(int(rows[0][-1]))
    recorded: set[int] = set(rows[0][0] or ()) if rows else set()
    return recorded, [_slotted(row) for row in rows if row[1] is not None]


def next_gated_due_stmt(
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    admits: tuple[str, ...] = (),
    rates: tuple[str, ...] = (),
) -> Any:
    """Seconds until a limited job of ``names`` that ``served`` covers may next start, or
    NULL: a job scheduled
    later falls due, or the next window of a rate whose current window is full (its own
    limit, or one of the Rates ``rates`` given with a Concurrency of ``names``); or a run
    of the workflow limits ``admits`` held back until a later start falls due."""
    a = jobs.alias("a")
    k, lim = limit_keys, limits
    window = _window(lim.c.per)
    scheduled = (
        select(func.min(a.c.scheduled_at))
        .where(
            one_of(a.c.limit_name, names),
            a.c.state == const(JobState.AVAILABLE.value),
            a.c.scheduled_at > func.now(),
            true() if queues is None else one_of(a.c.queue, queues),
            _of_served(a, served),
        )
        .scalar_subquery()
    )
    b = jobs.alias("b")
    next_window = (
        select(func.min(window + lim.c.per))
        .join_from(k, lim, lim.c.name == k.c.name)
        .where(
            one_of(k.c.name, names),
            lim.c.per.is_not(None),
            k.c.window_start == window,
            k.c.window_count >= lim.c.max,
            _probe(select(b.c.id).where(*_due(b, k.c.name, k.c.key, queues, served))),
        )
        .scalar_subquery()
    )
    held = runs.alias("held")
    later = (
        select(func.min(held.c.limit_start_at))
        .where(
            one_of(held.c.limit_name, admits),
            *_held_runs(held),
            held.c.limit_start_at > func.now(),
        )
        .scalar_subquery()
    )
    paired_window: Any = null()
    if rates:
        k2, lim2, d = limit_keys.alias("rk2"), limits.alias("rl2"), jobs.alias("d")
        window2 = _window(lim2.c.per)
        waiting = select(d.c.id).where(
            *_due(d, d.c.limit_name, d.c.limit_key, queues, served),
            one_of(d.c.limit_name, names),
            d.c.rate_name == k2.c.name,
            d.c.rate_key == k2.c.key,
        )
        paired_window = (
            select(func.min(window2 + lim2.c.per))
            .join_from(k2, lim2, lim2.c.name == k2.c.name)
            .where(
                one_of(k2.c.name, rates),
                k2.c.window_start == window2,
                k2.c.window_count >= lim2.c.max,
                _probe(waiting),
            )
            .scalar_subquery()
        )
    due = func.least(scheduled, next_window, later, paired_window)
    return select(extract("epoch", due - func.now()).cast(Float))


@functools.lru_cache(maxsize=64)
def _fast_next_due(
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    admits: tuple[str, ...],
    rates: tuple[str, ...],
) -> _executor.Compiled:
    return _executor.Compiled(next_gated_due_stmt(names, queues, served, admits, rates))


def seconds_until_gated_due(
    conn: _executor.Executor,
    names: tuple[str, ...],
    queues: tuple[str, ...] | None,
    served: Served,
    admits: tuple[str, ...] = (),
    rates: tuple[str, ...] = (),
) -> float | None:
    """Seconds until a limited job of ``names`` may start (its Rate of ``rates`` too), or
    a held run of ``admits`` is due, None when none waits on time."""
    if not names and not admits:
        return None
    rows = conn.rows(_fast_next_due(names, queues, served, admits, rates), {})
    value = rows[0][0] if rows else None
    return None if value is None else max(0.0, float(value))


def _notify_workers() -> Any:
    return _notify.ring()


_RING = _executor.Compiled(select(_notify_workers()))


def ring(conn: _executor.Executor) -> None:
    """NOTIFY the workers: a limited job left running, its slot is free for whoever has
    room (a worker whose threads are all busy cannot take it itself)."""
    conn.rows(_RING, {})


# -- the operator's reads and writes ---------------------------------------------------


def _job_counts(name: Any, key: Any) -> Any:
    """Per limit and key: jobs running and jobs waiting (available: due or not), of the
    jobs whose ``name``, ``key`` columns name it (their own limit, or their Rate's)."""
    return (
        select(
            name.label("name"),
            key.label("key"),
            func.count().filter(jobs.c.state == const(JobState.RUNNING.value)).label("running"),
            func.count().filter(jobs.c.state == const(JobState.AVAILABLE.value)).label("waiting"),
        )
        .where(
            name.is_not(None),
            jobs.c.state.in_([const(JobState.RUNNING.value), const(JobState.AVAILABLE.value)]),
        )
        .group_by(name, key)
    )


def _run_counts() -> Any:
    """Per limit and key: runs in progress, and runs held back."""
    # IS NOT DISTINCT FROM: a started run's start_at is NULL, and it is in progress.
    held = runs.c.start_at.is_not_distinct_from(literal_column("'infinity'::timestamptz"))
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
    # A Rate's key counts the jobs of its own limit and those it gates beside a Concurrency.
    every = union_all(
        _job_counts(jobs.c.limit_name, jobs.c.limit_key),
        _job_counts(jobs.c.rate_name, jobs.c.rate_key),
        _run_counts(),
    ).subquery("every")
    counted = (
        select(
            every.c.name,
            every.c.key,
            func.sum(every.c.running).label("running"),
            func.sum(every.c.waiting).label("waiting"),
        )
        .group_by(every.c.name, every.c.key)
        .subquery("counted")
    )
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
    .returning(limits.c.name, _notify.ring())
)


def list_limits(engine: Engine) -> Sequence[Any]:
    """Rows ``(name, max, per, counts, on_limit, set_by_operator, key, running, waiting)``."""
    with _binds.autocommit(engine) as conn:
        return _executor.rows(conn, _LIST)


def set_limit(engine: Engine, name: str, max: int) -> bool:
    """Set the limit ``name``'s ``max`` (kept over its definitions' from now on); found?"""
    with _binds.autocommit(engine) as conn:
        return _executor.first(conn, _SET_LIMIT, {"b_name": name, "b_max": max}) is not None


# -- workflow limits: admitting held runs ---------------------------------------------


def admitted(start_at: Any) -> Any:
    """A run of a limited workflow with this ``start_at`` is admitted, not held: while it
    runs it holds a slot of its key."""
    return or_(start_at.is_(None), start_at < _INFINITY)


def _in_progress(name: Any, key: Any) -> tuple[Any, ...]:
    """A run in progress of ``name`` and ``key``: admitted, not ended
    (``ix_cyclone_runs_limited``)."""
    return (
        runs.c.limit_name == name,
        runs.c.limit_key == key,
        runs.c.state == const(RunState.RUNNING.value),
        admitted(runs.c.start_at),
    )


def _held_runs(table: Any) -> tuple[Any, ...]:
    """A run held back by its workflow's limit (the predicate of ``ix_cyclone_runs_held``)."""
    return (table.c.state == const(RunState.RUNNING.value), table.c.start_at == _INFINITY)


def _held_due(table: Any, name: Any, key: Any) -> tuple[Any, ...]:
    """A run of ``name`` and ``key`` held back whose start has come (``ix_cyclone_runs_held``)."""
    return (
        table.c.limit_name == name,
        table.c.limit_key == key,
        *_held_runs(table),
        table.c.limit_start_at <= func.now(),
        or_(table.c.deadline.is_(None), table.c.deadline > func.now()),
    )


def _held_keys(names: tuple[str, ...], k: Any) -> Any:
    """The select of the key rows ``k`` of the limits ``names`` with a held run due, given
    more conditions (for :func:`_in_turn`); a ``"queue"`` key only if it looks to have
    room. Columns ``name``, ``key``, ``max``, ``on_limit``, ``served_at``."""
    h = runs.alias("h")
    r = runs.alias("r")
    running = (
        select(func.count())
        .where(
            r.c.limit_name == k.c.name,
            r.c.limit_key == k.c.key,
            r.c.state == const(RunState.RUNNING.value),
            or_(r.c.start_at.is_(None), r.c.start_at < _INFINITY),
        )
        .scalar_subquery()
    )

    def keys(*conditions: Any) -> Any:
        held = _probe(select(h.c.id).where(*_held_due(h, k.c.name, k.c.key)))
        return (
            select(k.c.name, k.c.key, limits.c.max, limits.c.on_limit, k.c.served_at)
            .join_from(k, limits, limits.c.name == k.c.name)
            .where(
                one_of(k.c.name, names),
                *conditions,
                held,
                or_(limits.c.on_limit != const("queue"), limits.c.max > running),
            )
        )

    return keys


def lock_held_keys_stmt(names: tuple[str, ...], batch: int) -> Any:
    """Lock up to ``batch`` keys of the limits ``names`` with a held run due, least recently
    served first, skipping locked ones; a ``"queue"`` key only if it looks to have room.

    One walk of the keys: the first ``2 * batch`` such keys are read in the statement's
    snapshot without locking, in turn as the limited claim reads its keys
    (:func:`_in_turn`; the keys with held runs found by ``ix_cyclone_runs_held``), then
    the first ``batch`` of those that no other transaction holds are locked, found by
    primary key (:func:`_keyed`), ``FOR UPDATE SKIP LOCKED`` (the limit counts the rows
    locked; a lock that skips never waits, so it takes no part in the lock order of
    :func:`keys_locked_first`). Reading twice the batch lets two admissions at once
    serve two batches: the second, whose snapshot still shows the first's keys due,
    skips them and takes the next. A locked row is read at its newest version, but
    nothing on the key row itself decides whether it is served (its name and key are
    its primary key; ``served_at`` only placed it in turn): a key served by another
    admission since the snapshot is served again correctly, its runs in progress and
    held being read after the lock, in a new snapshot (:func:`admit_runs`).

    Rows ``(name, key, max, on_limit, contended)``, and at least one (its first four
    columns NULL when no key is locked): ``contended`` counts the keys read that it could
    not lock and that come before the last key it locked (all of them when it locked
    fewer than ``batch``), another transaction holding them (another worker's admission;
    a retry's, a fork's or a child node's check of room). Nothing rings when that
    transaction ends, nor does anything fall due, so the worker admits again shortly for
    them rather than at its poll."""
    top: Any = literal_column(str(int(batch)))
    wide: Any = literal_column(str(2 * int(batch)))
    found = _keys_of(names, "held_keys", runs, _held_runs)
    bound = _front_bound(names, batch, "held_bound")
    s = limit_keys.alias("held_key")
    seen = _in_turn(_held_keys(names, s), s, names, found, bound, wide, "held", lock=False).cte(
        "held_keys_in_turn"
    )
    turn = func.row_number().over(order_by=(seen.c.served_at, seen.c.name, seen.c.key))
    ranked = select(seen.c.name, seen.c.key, turn.label("rn")).cte("held_keys_ranked")
    k = limit_keys
    locked = (
        select(k.c.name, k.c.key)
        .where(_keyed(k, names, seen.c.name, seen.c.key))
        .order_by(k.c.served_at, k.c.name, k.c.key)
        .limit(top)
        .with_for_update(of=k, skip_locked=True)
        .cte("held_keys_locked")
    )
    is_locked = and_(locked.c.name == seen.c.name, locked.c.key == seen.c.key)
    ranked_locked = and_(locked.c.name == ranked.c.name, locked.c.key == ranked.c.key)
    taken = select(func.count()).select_from(locked).scalar_subquery()
    last = (
        select(func.max(ranked.c.rn)).select_from(ranked.join(locked, ranked_locked))
    ).scalar_subquery()
    skipped = (
        select(func.count())
        .select_from(ranked)
        .where(
            ~exists(select(locked.c.key).where(ranked_locked)),
            or_(taken < top, ranked.c.rn < last),
        )
        .scalar_subquery()
    )
    one = select(const(1, Integer).label("one")).subquery("one")
    return (
        select(seen.c.name, seen.c.key, seen.c.max, seen.c.on_limit, skipped.label("contended"))
        .select_from(one.outerjoin(seen.join(locked, is_locked), true()))
        .order_by(seen.c.served_at, seen.c.name, seen.c.key)
    )


_NAME, _KEY = bindparam("b_name", type_=Text), bindparam("b_key", type_=Text)
_IN_PROGRESS = (
    select(runs.c.id).where(*_in_progress(_NAME, _KEY)).order_by(runs.c.created_at, runs.c.id)
)
_HELD = (
    select(runs.c.id)
    .where(*_held_due(runs, _NAME, _KEY))
    .order_by(runs.c.limit_start_at, runs.c.id)
    .limit(bindparam("b_n", type_=Integer))
)
_ADMIT = (
    update(runs)
    .where(
        runs.c.id == func.any(bindparam("b_ids", type_=ARRAY(Uuid))),
        runs.c.state == const(RunState.RUNNING.value),
        runs.c.start_at == _INFINITY,
    )
    .values(start_at=runs.c.limit_start_at)
    .returning(runs.c.id, _notify.ring())
)
_SERVED = (
    update(limit_keys)
    .where(limit_keys.c.name == _NAME, limit_keys.c.key == _KEY)
    .values(served_at=func.clock_timestamp(), version=limit_keys.c.version + 1)
)
_LOCK_KEY = (
    select(limits.c.max)
    .join_from(limit_keys, limits, limits.c.name == limit_keys.c.name)
    .where(limit_keys.c.name == _NAME, limit_keys.c.key == _KEY)
    .with_for_update(of=limit_keys)
)


def keys_locked_first(run_ids: Any) -> Any:
    """A condition that locks the limit keys of the runs whose id ``= run_ids`` (a bind, or
    an ``ANY`` of one) before anything else: the first lock of a statement that locks runs.

    The one order of a limit's key and runs: keys first (by name, then key), then runs.
    An admission locks keys, then the runs in progress it cancels (and their trees); a
    transaction that waits for a key while it holds a run (a retry's, a fork's, a child
    node's) could hold a run that admission waits for. An uncorrelated scalar subquery is
    a one-time filter, evaluated before the scan it guards reads a row (see
    :func:`cyclone._store.completion.runs_locked_first`); a run's limit and key never
    change, so its unlocked read names the key to lock.
    """
    keyed = runs.alias("keyed")
    locked = (
        select(limit_keys.c.name)
        .where(
            tuple_(limit_keys.c.name, limit_keys.c.key).in_(
                select(keyed.c.limit_name, keyed.c.limit_key).where(
                    keyed.c.id == run_ids, keyed.c.limit_name.is_not(None)
                )
            )
        )
        .order_by(limit_keys.c.name, limit_keys.c.key)
        .with_for_update(of=limit_keys)
        .cte("locked_keys")
    )
    return select(func.count()).select_from(locked).scalar_subquery() >= const(0, Integer)


def lock_key(conn: Any, name: str, key: str) -> None:
    """Lock the limit ``name``'s key ``key`` (its row, if it exists) until the caller commits:
    before any run, as :func:`keys_locked_first` does."""
    _executor.first(conn, _LOCK_KEY, {"b_name": name, "b_key": key})


_RUN_LIMIT = select(runs.c.limit_name, runs.c.limit_key, runs.c.start_at.is_(None)).where(
    runs.c.id == bindparam("rid")
)
_HOLD_AGAIN = (
    update(runs)
    .where(runs.c.id == bindparam("b_rid"))
    .values(start_at=_INFINITY, limit_start_at=func.now())
)
ADMIT_BATCH = 32
"""How many keys one admission serves at most."""


def limit_error(name: str, key: str, max: int, on_limit: str) -> str:
    """The error (JSON text) of a run a limit cancelled: it names the limit."""
    shown = "(all)" if key == "" else repr(key)
    return json.dumps(
        {
            "type": "ConcurrencyLimit",
            "message": f"cancelled by limit {name!r} (key {shown}, max {max} in progress, "
            f"on_limit={on_limit!r})",
        }
    )


@functools.lru_cache(maxsize=64)
def _lock_held_keys(names: tuple[str, ...], batch: int) -> Any:
    return lock_held_keys_stmt(names, batch)


class Orphans(NamedTuple):
    """Limits that a worker's definitions no longer name but some of its work still waits
    on: the jobs' (``gated``) and the held runs' (``admits``)."""

    gated: tuple[str, ...]
    steps: bool
    """Whether a job of ``gated`` is a workflow step (the first found of each limit)."""
    paired: bool
    """Whether a waiting job served has a Rate besides its limit that the worker's
    ``rates`` lack (every such job is looked at, one probe per limit and Rate)."""
    rates: tuple[str, ...]
    """The names of those Rates, each one that any of those jobs keeps: the read of when a
    limited job next may start reads them."""
    rated: bool
    """Whether a limit of ``gated`` is a Rate."""
    admits: tuple[str, ...]


def _names(table: Any, waiting: Any, label: str) -> Any:
    """The distinct limit names of ``table``'s rows that ``waiting(alias)`` holds for, as a
    recursive CTE (column ``n``): one probe of the index those rows are a range of per
    name, whatever the rows' number (a loose index scan)."""

    def least_above(after: Any) -> Any:
        probe = table.alias()
        return (
            select(probe.c.limit_name)
            .where(
                *waiting(probe),
                probe.c.limit_name.is_not(None),
                true() if after is None else probe.c.limit_name > after,
            )
            .order_by(probe.c.limit_name)
            .limit(const(1, Integer))
            .scalar_subquery()
        )

    names = select(least_above(None).label("n")).cte(label, recursive=True)
    return names.union_all(select(least_above(names.c.n)).where(names.c.n.is_not(None)))


def _available_jobs(table: Any) -> tuple[Any, ...]:
    return (table.c.state == const(JobState.AVAILABLE.value),)


def _rated_jobs(table: Any) -> tuple[Any, ...]:
    """An available job given a Rate besides its limit (the predicate of
    ``ix_cyclone_jobs_rated``)."""
    return (*_available_jobs(table), table.c.rate_name.is_not(None))


def _rate_pairs(label: str) -> Any:
    """The distinct pairs of a limit name and a Rate name that available jobs keep, as a
    recursive CTE (columns ``n``, ``r``): one probe of ``ix_cyclone_jobs_rated`` per pair,
    each for the least pair above the last by row comparison, whatever the jobs' number
    (a loose index scan)."""

    def least_above(after: Any) -> Any:
        probe = jobs.alias()
        pair = tuple_(probe.c.limit_name, probe.c.rate_name)
        return (
            select(probe.c.limit_name.label("n"), probe.c.rate_name.label("r"))
            .where(
                *_rated_jobs(probe),
                true() if after is None else pair > tuple_(after.c.n, after.c.r),
            )
            .order_by(probe.c.limit_name, probe.c.rate_name)
            .limit(const(1, Integer))
        )

    pairs = least_above(None).cte(label, recursive=True)
    above = least_above(pairs).lateral("next_pair")
    return pairs.union_all(select(above.c.n, above.c.r).select_from(pairs).join(above, true()))


def orphans_stmts(
    served: Served,
    gated: tuple[str, ...],
    admits: tuple[str, ...],
    rates: tuple[str, ...] = (),
) -> tuple[Any, Any]:
    """The two reads of :func:`orphans`: the limits of the available limited jobs and of
    the held runs that ``served`` still has work under although its definitions miss them.

    The first reads rows ``(limit name, step, Rate name, rated)`` of two kinds. A limit
    name of the available limited jobs (``ix_cyclone_jobs_gated``) not among ``gated``
    that ``served`` has such a job of, with whether the first such job found is a step
    and whether the limit is a Rate, its Rate name NULL. And a pair of a limit name and a
    Rate name that available jobs keep (``ix_cyclone_jobs_rated``, every pair looked at)
    whose Rate is not among ``rates`` and that ``served`` has such a job of: a Rate given
    with a limit that a deploy kept, dropped or renamed while the jobs keep it, found
    behind any number of jobs without it. The second reads the limit names of the held
    runs (``ix_cyclone_runs_held``) not among ``admits`` that ``served`` has such a run
    of."""
    names = _names(jobs, _available_jobs, "job_limits")
    theirs = jobs.alias("theirs")
    first = (
        select(theirs.c.run_id)
        .where(
            theirs.c.limit_name == names.c.n,
            *_available_jobs(theirs),
            _of_served(theirs, served),
        )
        .limit(const(1, Integer))
        .lateral("first_served")
    )
    limited = (
        select(
            names.c.n,
            first.c.run_id.is_not(None),
            cast(null(), Text),
            limits.c.per.is_not(None),
        )
        .join_from(names, first, true())
        .join(limits, limits.c.name == names.c.n)
        .where(~one_of(names.c.n, gated))
    )
    pairs = _rate_pairs("job_rates")
    rated = jobs.alias("rated")
    served_rated = (
        select(rated.c.id)
        .where(
            rated.c.limit_name == pairs.c.n,
            rated.c.rate_name == pairs.c.r,
            *_rated_jobs(rated),
            _of_served(rated, served),
        )
        .limit(const(1, Integer))
        .lateral("served_rated")
    )
    kept_rates = (
        select(pairs.c.n, false(), pairs.c.r, false())
        .join_from(pairs, served_rated, true())
        .where(~one_of(pairs.c.r, rates))
    )
    held_names = _names(runs, _held_runs, "run_limits")
    held = runs.alias("theirs")
    served_run = select(held.c.id).where(
        held.c.limit_name == held_names.c.n,
        *_held_runs(held),
        one_of(held.c.workflow, served.workflows),
    )
    return (
        union_all(limited, kept_rates),
        select(held_names.c.n).where(
            held_names.c.n.is_not(None), ~one_of(held_names.c.n, admits), _probe(served_run)
        ),
    )


@functools.lru_cache(maxsize=64)
def _orphans_compiled(
    served: Served, gated: tuple[str, ...], admits: tuple[str, ...], rates: tuple[str, ...]
) -> tuple[_executor.Compiled, _executor.Compiled]:
    """:func:`orphans_stmts` compiled once per worker's definitions: a worker looks before
    its first claim, every ``ADOPT_INTERVAL`` and at the end of each drain, and compiling
    the two reads took longer than running them."""
    waiting, held = orphans_stmts(served, gated, admits, rates)
    return _executor.Compiled(waiting, built=True), _executor.Compiled(held, built=True)


def orphans(
    conn: _executor.Executor,
    served: Served,
    gated: tuple[str, ...],
    admits: tuple[str, ...],
    rates: tuple[str, ...] = (),
) -> Orphans:
    """The limits ``served``'s waiting work is under that ``gated`` and ``admits`` miss.

    A run keeps the limits of the definition it was submitted with, and its steps take
    them when it starts: after a redeploy that drops or renames a limit, the steps and
    held runs submitted before it wait under a name no worker's definition serves. A
    worker serving their workflows (or step kinds) serves those names too, with the
    ``max`` their rows keep, until they have drained. So does a Rate given with a limit
    that ``rates`` (the worker's) lacks, whichever of the limit's waiting jobs keep it:
    its jobs keep it.
    """
    waiting, held = _orphans_compiled(served, gated, admits, rates)
    found = conn.rows(waiting)
    names = [row for row in found if row[2] is None]
    kept = sorted({row[2] for row in found if row[2] is not None})
    return Orphans(
        gated=tuple(sorted(row[0] for row in names)),
        steps=any(row[1] for row in names),
        paired=bool(kept),
        rates=tuple(kept),
        rated=any(row[3] for row in names),
        admits=tuple(sorted(row[0] for row in conn.rows(held))),
    )


_kind = func.unnest(bindparam("kinds", type_=ARRAY(Text))).column_valued("kind")
_UNLIMITED_KINDS = select(_kind).where(
    _probe(
        select(jobs.c.id).where(
            unlimited_standalone(jobs, jobs.c.kind == _kind), *_available_jobs(jobs)
        )
    )
)


def unlimited_kinds(conn: _executor.Executor, kinds: tuple[str, ...]) -> tuple[str, ...]:
    """The limited step kinds of ``kinds`` that have available jobs enqueued without a
    limit (before a deploy gave the kind one): the ordinary claim takes those, one probe
    of ``ix_cyclone_jobs_claim_kind`` per kind."""
    if not kinds:
        return ()
    return tuple(row[0] for row in conn.rows(_UNLIMITED_KINDS, {"kinds": list(kinds)}))


def admit_runs(
    engine: Engine,
    names: tuple[str, ...],
    batch: int = ADMIT_BATCH,
    contended: list[int] | None = None,
) -> int:
    """Admit the held runs of the workflow limits ``names`` that have room; how many.
    ``contended`` is appended how many keys with a held run due (and room, for
    ``"queue"``) it skipped because another transaction held them: nothing rings when
    that one ends, and the next admission can serve them (:func:`lock_held_keys_stmt`).

    One transaction: lock the keys with a held run due (least recently served first,
    ``FOR UPDATE SKIP LOCKED``), then, each key locked, count its runs in progress in a
    new snapshot (every admission of the key committed before the lock was granted, so
    the count is exact or too high, a run having ended since), and per ``on_limit``:
    ``"queue"`` admits the oldest held runs up to the room; ``"cancel_newest"`` admits
    as ``"queue"`` and cancels the held runs left over; ``"cancel_in_progress"`` keeps
    the newest ``max`` of the key's runs in progress and held, cancelling the others,
    oldest first, and admits its held runs kept. An admitted run's ``start_at`` is the
    start it asked for (due), ringing NOTIFY: the next claim starts it.

    Every key read, the runs it cancels (with their running children) and admits, over
    all its keys, are locked by one statement in the run lock order (creation time, then
    id) before it acts on any (:func:`cyclone._store.control.lock_for_limit`): cancelling
    and admitting them key by key locked them in no such order, and a bulk cancel, or a
    worker recording steps of two runs, holding an older run of a later key and waiting
    for a run of an earlier key, deadlocked with it. A run that ended meanwhile is left
    as it is; a run in progress that did leaves the count too high, as before.
    """
    from cyclone._store import control as _control  # control imports this module

    admitted = 0
    with engine.begin() as conn:
        served: list[tuple[dict[str, Any], str, list[Any], list[Any]]] = []
        locked = _executor.rows(conn, _lock_held_keys(names, batch))
        if contended is not None and locked:
            contended.append(int(locked[0][-1]))
        for name, key, max_, on_limit, _ in locked:
            if name is None:
                continue  # no key locked: the row only counts the contended ones
            params = {"b_name": name, "b_key": key}
            in_progress = _executor.column(conn, _IN_PROGRESS, params)
            room = max(0, max_ - len(in_progress))
            if on_limit == "queue":
                held = _executor.column(conn, _HELD, {**params, "b_n": room})
                cancel: list[Any] = []
            else:
                held = _executor.column(conn, _HELD, {**params, "b_n": None})
                if on_limit == "cancel_newest":
                    held, cancel = held[:room], held[room:]
                else:
                    every = in_progress + held
                    over = max(0, len(every) - max_)
                    cancel = every[:over]
                    held = held[max(0, over - len(in_progress)) :]
            served.append((params, limit_error(name, key, max_, on_limit), cancel, held))
        acted = [run_id for _, _, cancel, held in served for run_id in (*cancel, *held)]
        if acted:
            _control.lock_for_limit(conn, acted)
        for params, error, cancel, held in served:
            if cancel:
                _control.cancel_for_limit(conn, cancel, error)
            if held:
                admitted += len(_executor.rows(conn, _ADMIT, {"b_ids": held}))
            _executor.affected(conn, _SERVED, params)
    return admitted


_KEYED_RUN = select(runs.c.id).where(
    runs.c.workflow == bindparam("b_workflow", type_=Text),
    runs.c.submit_key == bindparam("b_submit_key", type_=Text),
)


def room_for_fork(
    conn: Any,
    *,
    source_id: Any,
    name: str,
    key: str,
    workflow: str,
    fork_key: str,
    starts: bool,
) -> None:
    """Before the fork of a run of a limited workflow: under the key's lock (kept until the
    fork commits; taken before the source's, :func:`keys_locked_first`), when the fork
    ``starts`` (it has steps to run) and its submit key has no run yet, check that the
    limit's key has room for one more run in progress, as a retry of a started run does.
    A second fork of the key returns the first and needs no room.

    Raises:
        InvalidStateError: the key has ``max`` runs in progress.
    """
    params = {"b_name": name, "b_key": key}
    max_ = _executor.value(conn, _LOCK_KEY, params)
    keyed = {"b_workflow": workflow, "b_submit_key": fork_key}
    if starts and _executor.first(conn, _KEYED_RUN, keyed) is None:
        _refuse_when_full(conn, params, max_, source_id, "fork")
    _executor.affected(conn, _SERVED, params)


def _refuse_when_full(
    conn: Any, params: dict[str, Any], max_: int | None, run_id: Any, operation: str
) -> None:
    """Refuse ``operation`` on ``run_id`` when the limit's key (``params``, locked by the
    caller) has ``max_`` runs in progress already.

    Raises:
        InvalidStateError: naming the limit, the runs in progress and ``max_``.
    """
    from cyclone import errors

    in_progress = len(_executor.rows(conn, _IN_PROGRESS, params))
    if max_ is not None and in_progress >= max_:
        raise errors.InvalidStateError(
            operation=operation,
            run_id=run_id,
            state=f"at its limit {params['b_name']!r}: {in_progress} of {max_} runs in "
            f"progress for its key; {operation} once one ends",
        )


def hold_for_restart(conn: Any, run_id: Any, operation: str) -> None:
    """Before a limited run restarts (``retry``/``retry_all``): under its key's lock, check
    there is room. A run that never started is held again (admitted by a worker as a new
    one); a run that started (its steps exist) restarts in progress if its key has room,
    and is refused otherwise. Called under the run's lock, the caller having locked the
    key before it (:func:`keys_locked_first`, :func:`lock_key`: an admission locks keys,
    then runs); the key's lock is kept until the caller commits."""
    row = _executor.first(conn, _RUN_LIMIT, {"rid": run_id})
    if row is None or row[0] is None:
        return
    name, key, started = row
    params = {"b_name": name, "b_key": key}
    max_ = _executor.value(conn, _LOCK_KEY, params)
    if not started:
        _executor.affected(conn, _HOLD_AGAIN, {"b_rid": run_id})
        _executor.affected(conn, _SERVED, params)
        return
    _refuse_when_full(conn, params, max_, run_id, operation)
    _executor.affected(conn, _SERVED, params)
