"""The run and job state machines, declared once in :data:`EDGES`; CHECKs enforce the states.

Every state change is a guarded ``UPDATE`` (``WHERE state IN (sources)``) implementing
one or more edges of the table; :mod:`cyclone._store.transitions` names, for each edge, the
one builder of the store that implements it, and a test checks each against this table.

Lock order: a statement or transaction that locks both a run and its jobs locks the run
first (``FOR NO KEY UPDATE``; several runs by creation time, then id, which puts a child
run after its parent: :func:`cyclone.schema.run_lock_order`), then the jobs (in id
order). A cancel locks a tree of child runs in that order, in the statement that
cancels them; a bulk retry locks its batch and the children it stops waiting for in
that order, in one statement; a ``retry_all`` locks its run, then the children its map
items wait for (which it forgets), in that order, before the run's jobs. A limit's key
comes before every run: an admission locks keys, then the runs it acts on over all of
them, in that order, in one statement; a transaction that waits for a key locks it
before any run (:func:`cyclone._store.limits.keys_locked_first`).
A retry of a child run first takes ``FOR KEY SHARE`` of the top run of its tree, before
any key: it conflicts only with a purge's delete of that tree, which skips locked runs
and takes no key. Submit inserts the run only; a claim locks jobs, skipping locked rows,
and the runs it starts (whose jobs do not exist yet), skipping locked runs, then inserts
their jobs; a heartbeat locks jobs only, skipping locked rows; a hand-back locks the
runs of its running jobs, then the jobs, in id order; a worker deciding about a wait or
sleep node locks its run, then its job. So no two of them wait for each other in a cycle: there is
no deadlock to retry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class RunState(StrEnum):
    """The state of a workflow run."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobState(StrEnum):
    """The state of a job: one step of a run, or a standalone job."""

    BLOCKED = "blocked"
    AVAILABLE = "available"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Parked(StrEnum):
    """Why a running run, or a step of it, waits with nothing to do until an event or a time.

    Not a state: a parked run's state stays ``running``. ``WAITING``: a wait node waits for
    its signal; ``SLEEPING``: a sleep node waits for its time; ``DELAYED``: a run submitted
    with ``run_at=``/``delay=`` waits to start. A run is parked only while none of its steps
    runs or is due (a run with a step running beside a waiting one is running).
    """

    WAITING = "waiting"
    SLEEPING = "sleeping"
    DELAYED = "delayed"


TERMINAL_RUN_STATES: frozenset[RunState] = frozenset(
    {RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED}
)
TERMINAL_JOB_STATES: frozenset[JobState] = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
)
ACTIVE_JOB_STATES: frozenset[JobState] = frozenset(JobState) - TERMINAL_JOB_STATES


@dataclass(frozen=True, slots=True)
class Edge:
    """One transition: ``UPDATE ... SET state = target WHERE state IN sources``."""

    machine: Literal["run", "job"]
    name: str
    sources: tuple[str, ...]
    target: str

    @property
    def key(self) -> str:
        return f"{self.machine}.{self.name}"


_R, _J = RunState, JobState
_TERMINAL_JOBS = (_J.COMPLETED.value, _J.FAILED.value, _J.CANCELLED.value)
_UNSTARTED = (_J.BLOCKED.value, _J.AVAILABLE.value)

EDGES: dict[str, Edge] = {
    edge.key: edge
    for edge in (
        # runs
        Edge("run", "complete", (_R.RUNNING.value,), _R.COMPLETED.value),
        Edge("run", "complete_restarted", (_R.RUNNING.value,), _R.COMPLETED.value),
        Edge("run", "fail", (_R.RUNNING.value,), _R.FAILED.value),
        Edge("run", "expire", (_R.RUNNING.value,), _R.FAILED.value),
        Edge("run", "cancel", (_R.RUNNING.value,), _R.CANCELLED.value),
        Edge("run", "retry", (_R.FAILED.value, _R.CANCELLED.value), _R.RUNNING.value),
        Edge(
            "run",
            "retry_all",
            (_R.COMPLETED.value, _R.FAILED.value, _R.CANCELLED.value),
            _R.RUNNING.value,
        ),
        # jobs
        Edge("job", "unblock", (_J.BLOCKED.value,), _J.AVAILABLE.value),
        Edge("job", "claim", (_J.AVAILABLE.value,), _J.RUNNING.value),
        Edge("job", "continue", (_J.BLOCKED.value,), _J.RUNNING.value),
        Edge("job", "complete", (_J.RUNNING.value,), _J.COMPLETED.value),
        Edge("job", "retry_attempt", (_J.RUNNING.value,), _J.AVAILABLE.value),
        Edge("job", "fail", (_J.RUNNING.value,), _J.FAILED.value),
        Edge("job", "cancel_ended", (_J.RUNNING.value,), _J.CANCELLED.value),
        Edge("job", "cancel_ended_attempt", (_J.RUNNING.value,), _J.CANCELLED.value),
        Edge("job", "cancel_ended_park", (_J.RUNNING.value,), _J.CANCELLED.value),
        Edge("job", "park", (_J.RUNNING.value,), _J.AVAILABLE.value),
        Edge("job", "park_blocked", (_J.RUNNING.value,), _J.BLOCKED.value),
        Edge("job", "wake_parent", (_J.BLOCKED.value,), _J.AVAILABLE.value),
        Edge("job", "repark_item", (_J.AVAILABLE.value,), _J.BLOCKED.value),
        Edge("job", "fan_out", (_J.RUNNING.value,), _J.BLOCKED.value),
        Edge(
            "job",
            "fail_map_node",
            (_J.BLOCKED.value, _J.AVAILABLE.value, _J.RUNNING.value),
            _J.FAILED.value,
        ),
        Edge("job", "rescue", (_J.RUNNING.value,), _J.AVAILABLE.value),
        Edge("job", "rescue_give_up", (_J.RUNNING.value,), _J.FAILED.value),
        Edge("job", "hand_back", (_J.RUNNING.value,), _J.AVAILABLE.value),
        Edge("job", "cancel", _UNSTARTED, _J.CANCELLED.value),
        Edge("job", "retry", (_J.FAILED.value, _J.CANCELLED.value), _J.AVAILABLE.value),
        Edge("job", "cancel_unstarted", _UNSTARTED, _J.CANCELLED.value),
        Edge("job", "cancel_unstarted_expired", _UNSTARTED, _J.CANCELLED.value),
        Edge("job", "reset", (_J.FAILED.value, _J.CANCELLED.value), _J.AVAILABLE.value),
        Edge("job", "reset_blocked", (_J.FAILED.value, _J.CANCELLED.value), _J.BLOCKED.value),
        Edge("job", "reset_all", _TERMINAL_JOBS, _J.AVAILABLE.value),
        Edge("job", "reset_all_blocked", _TERMINAL_JOBS, _J.BLOCKED.value),
    )
}
"""Every transition of runs and jobs, by ``machine.name``.

A job is born when the claim that starts its run creates the run's steps: blocked, or
(a root) available, or running for that claim's worker, its first attempt. A blocked step
whose last upstream step completes is made available (``unblock``), or, when the worker
recording that completion could claim it, running for that worker in the same statement
(``continue``).

A step whose run ended while it ran (cancelled, failed by another step, past its
deadline) is cancelled when it is rescued or handed back (``cancel_ended``), when its
attempt fails (``cancel_ended_attempt``), or when it is a wait or sleep node that would
park (``cancel_ended_park``). A wait or sleep node parks: ``park`` until a time,
``park_blocked`` until a signal; a child node parks as ``park_blocked`` until its child
run ends, and is made available again then (``wake_parent``); an item of a retried map
of children that retries its child also retries the children of the next items waiting
to do the same, and parks those items without their being claimed (``repark_item``).
A map node parks until its items complete (``fan_out``), or fails when one of them fails
for good (``fail_map_node``), after it created them or after a retry reset the failed
ones: parked, or, after a retry, not parked again yet (available, or running for a
worker deciding about it, whose lease then moves on). Unstarted jobs are cancelled by
hand (``cancel``, a standalone job), when their run fails or is cancelled
(``cancel_unstarted``), or when it expires (``cancel_unstarted_expired``). A failed or
cancelled standalone job is run again by hand (``retry``). A run completes when its last
step does (``complete``) or when it is retried with every step already completed
(``complete_restarted``).

Each edge is taken by exactly one statement builder of the store, listed in
:data:`cyclone._store.transitions.BUILDERS`; edges with the same sources and target are
distinct operations, written by distinct statements.
"""
