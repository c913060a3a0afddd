"""Claim runnable jobs in batches with ``FOR UPDATE SKIP LOCKED``.

The CTE fences the ``LIMIT``: without it the planner may lock more rows than it returns.
A step of a run that is no longer running is never claimed, even if a late re-queue
raced with the run's cancellation, and neither is a job of a paused queue
(:mod:`cyclone._store.queues`).
The same statement reads the run's input and the outputs of the steps a job comes after,
so a claimed job needs no further query before it runs. A claim of a worker serving
workflows also delivers the signals sent to parked wait nodes (see :mod:`cyclone._store.waits`).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    extract,
    false,
    func,
    literal_column,
    null,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from cyclone import _observe
from cyclone._store import completion as _completion
from cyclone._store import definitions as _definitions
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from cyclone._store import queues as _queues
from cyclone._store import unstarted as _unstarted
from cyclone._store.executor import among, const, one_of
from cyclone.schema import STEP_JOB_COLUMNS, jobs, runs, signals
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
    lease: int
    """The claim's fence: every outcome, heartbeat and cancellation check compares it."""
    max_attempts: int
    deadline: datetime | None
    input: str | None
    upstream: dict[str, msgspec.Raw]
    key: str | None = None
    trace_context: str | None = None
    item: int | None = None
    """A map item's index in the list its map node maps over (its ``input`` is the item)."""
    slot: tuple[str, str] | None = None
    """The limit's name and key whose slot a limited claim gave it."""


@dataclass(frozen=True, slots=True)
class Scope:
    """What one worker claims, rendered into its own claim statement as literals.

    With parameters, a generic plan can see neither how few kinds a worker serves nor
    how few jobs it claims (it assumes ``LIMIT $1`` returns a tenth of the table), so
    PostgreSQL would re-plan the statement (1 to 2 ms) on every claim; the limit is a
    literal too (one cached statement per limit value).
    """

    queues: tuple[str, ...] | None
    workflows: tuple[str, ...]
    kinds: tuple[str, ...]

    @property
    def merges(self) -> bool:
        """Whether a claim merges several served keys (candidates from one snapshot)."""
        return len(self.workflows) + len(self.kinds) > 1


def claimed_step_columns(claimed: Any, done: Any = None) -> tuple[Any, ...]:
    """A claimed job's input, its upstream outputs, key and trace context, read from its
    run (joined as ``runs``, outer: a standalone job has none): in :class:`Claimed`'s order
    after :func:`claimed_job_columns`. ``done``: the jobs the statement completes, whose
    outputs a step it continues reads from it (its snapshot has them running)."""
    stored = _completion.upstream_outputs(jobs.alias("upstream"), claimed)
    merged: Any = stored
    if done is not None:
        empty = cast(const("{}"), JSONB)
        recorded = _completion.upstream_outputs(done, claimed)
        merged = func.coalesce(stored, empty).op("||", return_type=JSONB)(
            func.coalesce(recorded, empty)
        )
    outputs = cast(merged, Text)
    return (
        # A map item runs with its item (its args), any other step with its run's input.
        cast(
            case(
                (claimed.c.item.is_not(None), claimed.c.args),
                else_=func.coalesce(runs.c.input, claimed.c.args),
            ),
            Text,
        ),
        outputs,
        func.coalesce(runs.c.submit_key, claimed.c.unique_key),
        func.coalesce(runs.c.trace_context, claimed.c.trace_context),
    )


def with_runs(claimed: Any) -> Any:
    """``claimed`` outer-joined to its jobs' runs, for :func:`claimed_step_columns`.

    The runs are found by their ids (:func:`among`): a claim's generic plan sizes
    ``claimed`` at a few rows, and otherwise hashed them against a scan of every run
    while the table holds some thousand runs, once per claim until it grew fourfold.
    """
    return claimed.outerjoin(
        runs,
        and_(runs.c.id == claimed.c.run_id, among(runs.c.id, select(claimed.c.run_id))),
    )


def claimed_job_columns(claimed: Any) -> tuple[Any, ...]:
    """The columns of a claimed job's row that every claim returns, in :class:`Claimed`'s
    order (its id, run, workflow, kind, queue, attempt, lease, max attempts, deadline)."""
    c = claimed.c
    return (
        c.id,
        c.run_id,
        c.workflow,
        c.kind,
        c.queue,
        c.attempt,
        c.lease,
        c.max_attempts,
        c.deadline,
    )


CANDIDATES_PER_CLAIMED = 4
MIN_CANDIDATES = 256
"""With several served keys, each key offers ``max(4 * limit, 256)`` candidates."""


def _serves(table: Any, key: tuple[str, str]) -> Any:
    """The jobs of one served key: a workflow's steps, or a standalone kind's jobs.

    Each is a range of its own claim index (``ix_cyclone_jobs_claim_workflow`` or
    ``ix_cyclone_jobs_claim_kind``), so a claim never reads the available jobs of
    workflows and kinds its worker does not serve. Limited steps and jobs are not in their
    range: the limited claim takes them (:mod:`cyclone._store.limits`), also those of a
    limit their definition no longer has.
    """
    what, name = key
    if what == "workflow":
        return and_(table.c.workflow == const(name), table.c.limit_name.is_(None))
    return unlimited_standalone(table, table.c.kind == const(name))


def unlimited_standalone(table: Any, kind: Any) -> Any:
    """Standalone jobs of no limit whose kind ``kind`` (a condition on ``table.c.kind``)
    matches: ranges of ``ix_cyclone_jobs_claim_kind``, whose predicate leaves out limited
    jobs (cyclone_0022_kind_claim_index), so every read of it says so too."""
    return and_(table.c.workflow.is_(None), kind, table.c.limit_name.is_(None))


def next_due_seconds(scope: Scope) -> Any:
    """Seconds from now until the earliest not-yet-due job or run start of ``scope``, or
    NULL: what an idle worker sleeps until (see :mod:`cyclone._store.due`).

    It reads the claim indexes' ranges of the served workflows and kinds, and a run
    submitted for later (no jobs yet) from ``ix_cyclone_runs_start``'s.
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
    return extract("epoch", due - func.now()).cast(Float)


def available(table: Any, queues: tuple[str, ...] | None) -> tuple[Any, ...]:
    """An available job of ``queues`` (None: any) that is due and not past its deadline,
    in a queue not paused (the paused queues are read once per statement): what a claim
    takes, and what the re-park of a retried map's items takes without a claim
    (:func:`cyclone._store.children.siblings_stmt`)."""
    return (
        table.c.state == const(JobState.AVAILABLE.value),
        true() if queues is None else one_of(table.c.queue, queues),
        table.c.scheduled_at <= func.now(),
        or_(table.c.deadline.is_(None), table.c.deadline > func.now()),
        _queues.served(table.c.queue),
    )


def _runnable(table: Any, scope: Scope) -> tuple[Any, ...]:
    """What makes an available job of ``scope`` runnable now, checked on ``table``'s row.

    The run's state is read by a scalar probe of its primary key: an ``EXISTS`` here
    becomes a hashed subplan once many jobs are estimated, which reads every running run
    on every claim. A standalone job has no run (``run_or_standalone``), a step has one.
    """
    if not scope.workflows:
        return available(table, scope.queues)
    run_running = (
        select(runs.c.state == const(RunState.RUNNING.value))
        .where(runs.c.id == table.c.run_id)
        .scalar_subquery()
    )
    run_check = run_running if not scope.kinds else or_(table.c.run_id.is_(None), run_running)
    return (*available(table, scope.queues), run_check)


def _pick(scope: Scope, limit: int) -> Any:
    """Lock up to ``limit`` runnable jobs of ``scope``, in priority order, skipping locked ones.

    A single served key is one index range, read in order and locked row by row under
    ``LIMIT``. Several are merged: each key offers its first ``max(4 * limit, 256)``
    runnable-looking jobs in order (its own ``LIMIT``, so an ordered index scan, never a
    read and sort of its whole backlog), the candidates are merged in priority order,
    and each is locked and re-checked on its row as it is reached. So only rows claimed
    (or skipped as locked) are locked here: rows locked and left would be skipped by the
    other workers woken by the same NOTIFY, who would then sleep until their next poll.
    :func:`_choose` may still leave some locked and unchosen when the jobs and the runs
    to start it ranks together exceed the limit: that claim filled its batch, and its
    worker claims again when it has room.
    Candidates come from the statement's snapshot: a key whose offered jobs were all
    taken by concurrent claims yields none this time (a drain claims once more before
    it ends). The workflow and kind are not re-checked on the row (they never change):
    stating them again would let the planner read whole index ranges.
    """
    keys = sorted({("workflow", w) for w in scope.workflows} | {("kind", k) for k in scope.kinds})
    top: Any = literal_column(str(int(limit)))
    if not scope.merges:
        return (
            select(jobs.c.id, jobs.c.priority, jobs.c.scheduled_at)
            .where(_serves(jobs, keys[0]) if keys else false(), *_runnable(jobs, scope))
            .order_by(jobs.c.priority, jobs.c.scheduled_at, jobs.c.id)
            .limit(top)
            .with_for_update(skip_locked=True)
        )
    c = jobs.alias("c")
    offered: Any = literal_column(str(max(int(limit) * CANDIDATES_PER_CLAIMED, MIN_CANDIDATES)))
    candidates = union_all(
        *(
            select(c.c.id, c.c.priority, c.c.scheduled_at)
            .where(_serves(c, key), *available(c, scope.queues))
            .order_by(c.c.priority, c.c.scheduled_at, c.c.id)
            .limit(offered)
            for key in keys
        )
    ).subquery("cand")
    return (
        select(jobs.c.id, jobs.c.priority, jobs.c.scheduled_at)
        .join_from(candidates, jobs, jobs.c.id == candidates.c.id)
        .where(*_runnable(jobs, scope))
        .order_by(candidates.c.priority, candidates.c.scheduled_at, candidates.c.id)
        .limit(top)
        .with_for_update(of=jobs, skip_locked=True)
    )


def _due_run(table: Any) -> tuple[Any, ...]:
    """A run not started yet whose time has come, still running and not past its deadline."""
    return (
        table.c.start_at.is_not(None),
        table.c.state == const(RunState.RUNNING.value),
        table.c.start_at <= func.now(),
        or_(table.c.deadline.is_(None), table.c.deadline > func.now()),
    )


def _pick_runs(scope: Scope, limit: int) -> Any:
    """Lock up to ``limit`` due runs of the served workflows, oldest first.

    Each workflow is a range of ``ix_cyclone_runs_start``; several are merged as
    :func:`_pick` merges jobs. The start time is re-checked on the locked row, so a run
    another worker started meanwhile is skipped. The lock is ``FOR NO KEY UPDATE``: the
    key-share lock of a signal being sent to the run (its foreign key) does not hold the
    start back.
    """
    top: Any = literal_column(str(int(limit)))
    if len(scope.workflows) == 1:
        return (
            select(runs.c.id, runs.c.start_at)
            .where(runs.c.workflow == const(scope.workflows[0]), *_due_run(runs))
            .order_by(runs.c.start_at, runs.c.id)
            .limit(top)
            .with_for_update(skip_locked=True, key_share=True)
        )
    c = runs.alias("rc")
    candidates = union_all(
        *(
            select(c.c.id, c.c.start_at)
            .where(c.c.workflow == const(name), *_due_run(c))
            .order_by(c.c.start_at, c.c.id)
            .limit(top)
            for name in sorted(scope.workflows)
        )
    ).subquery("rcand")
    return (
        select(runs.c.id, runs.c.start_at)
        .join_from(candidates, runs, runs.c.id == candidates.c.id)
        .where(*_due_run(runs))
        .order_by(candidates.c.start_at, candidates.c.id)
        .limit(top)
        .with_for_update(of=runs, skip_locked=True, key_share=True)
    )


def _start_runs(scope: Scope, limit: int, chosen: Any, taken: Any) -> Any:
    """Start the runs ``chosen`` (``run_id``, ``t``: its start time): create their steps,
    claiming roots for the slots the ``taken`` jobs (a count) left free.

    Every step of a started run is inserted from the graph of its run's definition, blocked or
    (a root) available, as the submit did before the steps moved here; the roots of the
    served queues take the free slots in priority and start order, and are inserted
    running for ``:me``, their first attempt. The ``RETURNING`` rings NOTIFY for each
    root left available, for the other workers.
    """
    room = const(int(limit), Integer) - taken
    starting = select(chosen.c.run_id).where(chosen.c.run_id.is_not(None))
    started = (
        update(runs)
        .where(among(runs.c.id, starting), runs.c.id == chosen.c.run_id)
        .values(start_at=null())
        .returning(
            runs.c.id,
            runs.c.workflow,
            runs.c.definition,
            runs.c.deadline,
            runs.c.created_at,
            runs.c.step_limits,
            chosen.c.t.label("starts"),
        )
        .cte("started")
    )
    elements, step = _unstarted.graph_steps(_definitions.graph_of(started))
    root = _unstarted.is_root(step)
    step_limit = started.c.step_limits.op("->", return_type=JSONB)(step.c.name)
    limit_name = step_limit.op("->>", return_type=Text)(const("n"))
    eligible = and_(
        root,
        limit_name.is_(None),
        true() if scope.queues is None else one_of(step.c.queue, scope.queues),
        _queues.served(step.c.queue),
    )
    rank = func.row_number().over(
        partition_by=eligible,
        order_by=(step.c.priority, started.c.starts, started.c.id, elements.c.ord),
    )
    born = (
        select(
            started.c.id.label("run_id"),
            started.c.workflow,
            started.c.deadline,
            started.c.starts,
            started.c.created_at,
            elements.c.ord,
            step.c.name,
            step.c.after,
            step.c.max_attempts,
            step.c.queue,
            step.c.priority,
            step.c.signal,
            limit_name.label("limit_name"),
            step_limit.op("->>", return_type=Text)(const("k")).label("limit_key"),
            step_limit.op("->>", return_type=Text)(const("rn")).label("rate_name"),
            step_limit.op("->>", return_type=Text)(const("rk")).label("rate_key"),
            root.label("root"),
            and_(eligible, rank <= room).label("mine"),
        )
        .select_from(started)
        .join(elements, true())
        .join(step, true())
        .subquery("born")
    )
    mine = born.c.mine
    rows = select(
        born.c.run_id,
        born.c.workflow,
        born.c.name,
        born.c.queue,
        born.c.priority,
        case(
            (mine, const(JobState.RUNNING.value)),
            (born.c.root, const(JobState.AVAILABLE.value)),
            else_=const(JobState.BLOCKED.value),
        ),
        born.c.after,
        func.cardinality(born.c.after),
        born.c.max_attempts,
        born.c.deadline,
        born.c.starts,
        born.c.created_at,
        case(
            (
                born.c.signal.is_not(None),
                func.jsonb_build_object(const("signal"), born.c.signal),
            ),
        ),
        case((mine, const(1, Integer)), else_=const(0, Integer)),
        case((mine, const(1, Integer)), else_=const(0, Integer)),
        case((mine, bindparam("me", type_=Text))),
        case((mine, func.now())),
        case((mine, func.now())),
        born.c.limit_name,
        born.c.limit_key,
        born.c.rate_name,
        born.c.rate_key,
    ).order_by(born.c.run_id, born.c.ord)
    return (
        insert(jobs)
        .from_select(
            [
                *STEP_JOB_COLUMNS,
                jobs.c.deadline,
                jobs.c.scheduled_at,
                jobs.c.created_at,
                jobs.c.args,
                jobs.c.attempt,
                jobs.c.lease,
                jobs.c.worker_id,
                jobs.c.attempted_at,
                jobs.c.heartbeat_at,
                jobs.c.limit_name,
                jobs.c.limit_key,
                jobs.c.rate_name,
                jobs.c.rate_key,
            ],
            rows,
        )
        .returning(*_CLAIMED_COLUMNS, jobs.c.state, _notify.when_available(jobs.c.state))
        .cte("new_jobs")
    )


_CLAIMED_COLUMNS = (
    jobs.c.id,
    jobs.c.run_id,
    jobs.c.workflow,
    jobs.c.kind,
    jobs.c.queue,
    jobs.c.attempt,
    jobs.c.lease,
    jobs.c.max_attempts,
    jobs.c.deadline,
    jobs.c.deps,
    jobs.c.args,
    jobs.c.priority,
    jobs.c.scheduled_at,
    jobs.c.unique_key,
    jobs.c.trace_context,
    jobs.c.item,
)


PLANNED_ON = (jobs, runs)
"""The tables whose growth can change the plans of the claim and the record: a worker's
held connection plans them again as these grow (:data:`cyclone._store.executor.REPLAN_GROWTH`)."""


DELIVER_PER_CLAIM = 16
"""How many pending signals one claim delivers at most."""


def deliver_signals_ctes() -> tuple[Any, Any]:
    """The CTEs that deliver signals sent to parked wait nodes: ``(delivered, woken)``.

    A sender writes the signal row only, marked ``wake_pending`` when its node had
    parked (:mod:`cyclone._store.waits`). Here the signal is unmarked and its node made
    available and due now (a node parked until a timeout, or blocked with no upstream
    pending), ringing NOTIFY; the claim statement's pick cannot see it (one snapshot), the
    next claim takes it. Signal and node rows locked elsewhere (a sender not committed, a
    worker deciding about the node) are skipped, never waited for: the next claim
    delivers them. The pending signals are a range of ``ix_cyclone_signals_wake_pending``,
    empty but for the signals sent since the last claim: no scan. A node due already is
    left alone: the claim's pick may be claiming it in this statement.
    """
    node = jobs.alias("node")
    pending = (
        select(signals.c.run_id, signals.c.name, node.c.id.label("job_id"))
        .join(
            node,
            and_(
                node.c.run_id == signals.c.run_id,
                node.c.args
                == cast(func.jsonb_build_object(const("signal"), signals.c.name), JSONB),
                node.c.item.is_(None),
            ),
        )
        .where(signals.c.wake_pending)
        .limit(literal_column(str(DELIVER_PER_CLAIM)))
        .with_for_update(of=[signals, node], skip_locked=True)
        .cte("pending_signals")
    )
    delivered = (
        update(signals)
        .where(signals.c.run_id == pending.c.run_id, signals.c.name == pending.c.name)
        .values(wake_pending=False)
        .returning(signals.c.run_id)
        .cte("delivered")
    )
    woken = (
        update(jobs)
        .where(
            jobs.c.id == pending.c.job_id,
            or_(
                and_(
                    jobs.c.state == const(JobState.BLOCKED.value),
                    jobs.c.pending_deps == const(0, Integer),
                ),
                and_(
                    jobs.c.state == const(JobState.AVAILABLE.value),
                    jobs.c.scheduled_at > func.now(),
                ),
            ),
        )
        .values(state=const(JobState.AVAILABLE.value), scheduled_at=func.now())
        .returning(_notify.when_available(jobs.c.state))
        .cte("woken")
    )
    return delivered, woken


def _choose(picked: Any, to_start: Any, limit: int, continuable: Any = None) -> Any:
    """The first ``limit`` of the locked jobs, the runs to start and the steps ``continuable``
    (made ready by the successes recorded), in priority and time order.

    A run to start ranks at the default priority by when it may start, a job or a step by
    its own priority and ``scheduled_at``: a job handed back or retried (scheduled anew)
    waits behind the runs submitted before, as it did behind their roots when a submit
    wrote them, and a step of a run started earlier comes before the runs submitted
    since. A row locked here but not chosen is left as it was, for the next claim.
    ``continued`` tells the steps from the jobs picked.
    """
    jobs_ = select(
        picked.c.id.label("job_id"),
        cast(null(), Uuid).label("run_id"),
        picked.c.priority.label("p"),
        picked.c.scheduled_at.label("t"),
        false().label("continued"),
    )
    runs_ = select(
        cast(null(), BigInteger),
        to_start.c.id,
        const(0, Integer),
        to_start.c.start_at,
        false(),
    )
    parts = [jobs_, runs_]
    if continuable is not None:
        parts.append(
            select(
                continuable.c.id,
                cast(null(), Uuid),
                continuable.c.priority,
                continuable.c.scheduled_at,
                true(),
            )
        )
    both = union_all(*parts).subquery("both")
    return (
        select(both.c.job_id, both.c.run_id, both.c.t, both.c.continued)
        .order_by(both.c.p, both.c.t, both.c.job_id)
        .limit(literal_column(str(int(limit))))
        .cte("chosen")
    )


def _count_running(advanced: Any) -> Any:
    """How many of the jobs ``advanced`` made running: the steps the statement continues."""
    return (
        select(func.count())
        .select_from(advanced)
        .where(advanced.c.state == const(JobState.RUNNING.value))
        .scalar_subquery()
    )


def claim_jobs_stmt(
    scope: Scope,
    limit: int,
    *,
    completing: bool = False,
    delivering: bool = True,
    dating: bool = False,
) -> Any:
    """Claim up to ``limit`` runnable jobs of ``scope`` for the worker ``:me``.

    ``completing`` adds the CTEs that first record the successes in ``:items`` (see
    :func:`cyclone._store.completion.complete_jobs_ctes`). They touch other rows than the claim
    (running jobs, blocked dependents, their runs), all in one snapshot. With workflows
    served, the dependents they make ready are ranked with the jobs picked and the runs
    to start (:func:`_choose`), and those among the first ``limit`` are continued:
    running for ``:me`` in the same statement
    (:class:`cyclone._store.completion.Continuing`). One they make ready and do not
    continue is made available, for the next claim here or elsewhere. The runs of
    ``:items`` are locked before the claim locks a job (the lock order), and the
    statement then returns at least one
    row, whose first column holds the ids of the jobs recorded (the others were refused:
    their lease was no longer the job's). The claimed columns follow; all NULL when
    nothing was claimed. ``delivering``, with workflows served, adds the delivery of
    pending signals (:func:`deliver_signals_ctes`, some 40 us more per claim): then the
    statement returns at least one row too, and a column counts the wait nodes it woke
    (0 without the delivery). The next column counts the jobs the recorded successes
    made available (0 without ``completing``). ``dating`` adds a last column,
    :func:`next_due_seconds` (the statement then returns at least one row): a woken claim
    learns when to wake next without a statement more.
    """
    runs_locked = _completion.runs_locked_first() if completing else None
    pick = _pick(scope, limit)
    if runs_locked is not None:
        pick = pick.where(runs_locked)
    picked = pick.cte("picked")
    to_start = _pick_runs(scope, limit).cte("to_start") if scope.workflows else None
    chosen: Any = None

    def choose(continuable: Any) -> Any:
        nonlocal chosen
        chosen = _choose(picked, to_start, limit, continuable)
        return select(chosen.c.job_id).where(chosen.c.continued)

    done: Any = None
    extra: tuple[Any, ...] = ()
    continued: Any = None
    unblocked: Any = const(0, Integer)
    if runs_locked is not None:
        continuing = (
            _completion.Continuing(scope.queues, scope.workflows, _CLAIMED_COLUMNS, choose)
            if scope.workflows
            else None
        )
        done, advanced, counted, finished = _completion.complete_jobs_ctes(runs_locked, continuing)
        extra = (advanced, counted, finished)
        unblocked = _completion.made_available(advanced, counted)
        if continuing is not None:
            continued = advanced
    if to_start is not None:
        if chosen is None:
            chosen = _choose(picked, to_start, limit)
        claim_where = among(
            jobs.c.id,
            select(chosen.c.job_id).where(
                chosen.c.job_id.is_not(None), chosen.c.continued.is_(False)
            ),
        )
    else:
        claim_where = among(jobs.c.id, select(picked.c.id))
    claimed = (
        update(jobs)
        .where(claim_where)
        .values(
            state=const(JobState.RUNNING.value),
            attempt=jobs.c.attempt + 1,
            lease=jobs.c.lease + 1,
            worker_id=bindparam("me", type_=Text),
            attempted_at=func.now(),
            heartbeat_at=func.now(),
        )
        .returning(*_CLAIMED_COLUMNS)
        .cte("claimed")
    )
    if chosen is not None:
        taken: Any = select(func.count()).select_from(claimed).scalar_subquery()
        if continued is not None:
            taken = taken + _count_running(continued)
        new_jobs = _start_runs(scope, limit, chosen, taken)
        names = [c.name for c in _CLAIMED_COLUMNS]
        parts = [
            select(*(claimed.c[n] for n in names)),
            select(*(new_jobs.c[n] for n in names)).where(
                new_jobs.c.state == const(JobState.RUNNING.value)
            ),
        ]
        if continued is not None:
            parts.append(
                select(*(continued.c[n] for n in names)).where(
                    continued.c.state == const(JobState.RUNNING.value)
                )
            )
        claimed = union_all(*parts).cte("claims")
    recorded: Any = cast(null(), ARRAY(BigInteger))
    if done is not None:
        recorded = select(func.array_agg(done.c.id)).scalar_subquery()
    woken: Any = None
    delivered_ctes: tuple[Any, ...] = ()
    if scope.workflows and delivering:
        delivered, woken = deliver_signals_ctes()
        delivered_ctes = (delivered,)
    stmt = select(
        recorded,
        *claimed_job_columns(claimed),
        *claimed_step_columns(claimed, done if continued is not None else None),
        const(0, Integer)
        if woken is None
        else select(func.count()).select_from(woken).scalar_subquery(),
        claimed.c.item,
        unblocked,
        *((next_due_seconds(scope),) if dating else ()),
    )
    claimed_runs = with_runs(claimed)
    if done is None and woken is None and not dating:
        stmt = stmt.select_from(claimed_runs)
    else:
        one = select(const(1, Integer).label("one")).subquery("one")
        stmt = stmt.select_from(one.outerjoin(claimed_runs, true()))
        for cte in (*extra, *delivered_ctes):
            stmt = stmt.add_cte(cte)
    # RETURNING follows the update's plan, not the claim's order: the worker starts jobs
    # in the order given here, so a concurrency-1 worker runs them by priority.
    return stmt.order_by(claimed.c.priority, claimed.c.scheduled_at, claimed.c.id)


def _record_and_claim_one() -> Any:
    return claim_jobs_stmt(Scope(queues=None, workflows=("w",), kinds=()), 1, completing=True)


_LIMIT_TOKEN = 2_147_480_009
"""A limit no claim asks for: a claim compiled with it has the limit's text where it goes."""


@functools.lru_cache(maxsize=64)
def _claim_template(
    scope: Scope, completing: bool, delivering: bool, dating: bool = False
) -> _executor.Compiled:
    return _executor.Compiled(
        claim_jobs_stmt(
            scope,
            _LIMIT_TOKEN,
            completing=completing,
            delivering=delivering,
            dating=dating,
        )
    )


@functools.lru_cache(maxsize=256)
def _fast_claim(
    scope: Scope, completing: bool, limit: int, delivering: bool = True, dating: bool = False
) -> _executor.Compiled:
    """The claim statement for ``limit`` jobs, its text compiled once per scope.

    A worker's free slots vary from claim to claim, and each limit is a literal of its
    own statement: with one key served, the statement for a new limit is the template's
    text with the limit put in. Several keys derive other literals from the limit
    (:data:`CANDIDATES_PER_CLAIMED`), so each such statement is compiled.
    """
    if scope.merges:
        return _executor.Compiled(
            claim_jobs_stmt(
                scope, limit, completing=completing, delivering=delivering, dating=dating
            )
        )
    template = _claim_template(scope, completing, delivering, dating)
    return template.replaced(str(_LIMIT_TOKEN), str(int(limit)))


def record_jobs_stmt() -> Any:
    """Record the successes in ``:items`` and claim nothing: the claim's record CTEs
    (:func:`cyclone._store.completion.complete_jobs_ctes`) alone, for a worker that has
    no room or no reason to claim. Without the claim's parts, its executor starts a
    fraction of their plan. Its row: the ids recorded, and how many jobs they made
    available (none continued: a worker continues steps only in a claim).
    """
    done, advanced, counted, finished = _completion.complete_jobs_ctes(
        _completion.runs_locked_first()
    )
    stmt = select(
        select(func.array_agg(done.c.id)).scalar_subquery(),
        _completion.made_available(advanced, counted),
    )
    for cte in (advanced, counted, finished):
        stmt = stmt.add_cte(cte)
    return stmt


_RECORD_JOBS = _executor.Compiled(record_jobs_stmt())


def record_jobs(
    conn: _executor.Executor,
    *,
    successes: Sequence[_completion.Success],
    unblocked: list[int] | None = None,
) -> set[int]:
    """Record ``successes`` in one autocommit statement and claim nothing; the ids
    recorded (the others were refused). ``unblocked`` is appended the number of jobs
    they made available, which the worker's next claim can take."""
    ((recorded, available),) = conn.rows(
        _RECORD_JOBS, {"items": _completion.items_payload(successes)}
    )
    if unblocked is not None:
        unblocked.append(int(available))
    return set(recorded or ())


_upstream_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _claimed(row: Sequence[Any]) -> Claimed:
    return Claimed(
        id=row[1],
        run_id=row[2],
        workflow=row[3],
        kind=row[4],
        queue=row[5],
        attempt=row[6],
        lease=row[7],
        max_attempts=row[8],
        deadline=row[9],
        input=row[10],
        upstream={} if row[11] is None else _upstream_decoder.decode(row[11]),
        key=row[12],
        trace_context=row[13],
        item=row[15],
    )


@_observe.claims
def record_and_claim(
    conn: _executor.Executor,
    *,
    worker_id: str,
    successes: Sequence[_completion.Success],
    scope: Scope,
    limit: int,
    woke: list[int] | None = None,
    deliver: bool = True,
    unblocked: list[int] | None = None,
    due: list[float | None] | None = None,
) -> tuple[set[int], list[Claimed]]:
    """Record ``successes`` and claim up to ``limit`` jobs in one autocommit statement.

    Returns the ids of the successes recorded (the others were refused) and the jobs
    claimed, the steps the successes made ready among them when the worker could claim
    them. With ``deliver``, the statement also delivers pending signals, and ``woke``
    is appended the number of wait nodes it woke: the next claim can take them.
    ``unblocked`` is appended the number of jobs the successes made available instead,
    which the next claim can take too. ``due`` is appended the seconds until the next
    job of ``scope`` falls due (None: none is scheduled), read in the same statement.
    """
    rows = conn.rows(
        _fast_claim(scope, bool(successes), limit, deliver, due is not None),
        {"me": worker_id, "items": _completion.items_payload(successes)},
    )
    if woke is not None and rows:
        woke.append(int(rows[0][14]))
    if unblocked is not None and rows:
        unblocked.append(int(rows[0][16]))
    if due is not None:
        seconds = rows[0][17]
        due.append(None if seconds is None else max(0.0, float(seconds)))
    recorded: set[int] = set(rows[0][0] or ()) if rows else set()
    return recorded, [_claimed(row) for row in rows if row[1] is not None]
