"""Each edge of :data:`cyclone.states.EDGES`, and the one statement builder that takes it.

A builder may take several edges (the record statement completes and unblocks jobs and
completes runs; the record-and-claim statement claims and continues jobs, and carries the
record statement's CTEs, built by the one function); no edge is taken by two builders.
The hand-back and the rescue release running jobs through one builder,
:func:`cyclone._store.rescue.release_jobs_stmt`, which owns the cancel of a job whose run
has ended. tests/test_states.py checks that every builder's guarded ``UPDATE`` guards on
its edge's sources and sets its target, and that every statement of the store that sets
a state is listed here.

The invariants that span edges, and the builders that keep them (the queries that check
them are in tests/support/invariants.py):

- A terminal run has no job available, blocked or running: a run's end takes its
  unstarted jobs with it in the same transaction (``run.fail`` and ``run.cancel`` with
  ``job.cancel_unstarted``, ``run.expire`` with ``job.cancel_unstarted_expired``), and a
  step still running when its run ended is cancelled by whatever comes next for it
  (``job.cancel_ended`` for a hand-back or rescue, ``job.cancel_ended_attempt`` for a
  failed attempt, ``job.cancel_ended_park`` for a wait or sleep node), each guarded by
  the run's state read under the run's lock.
- A running, started run's ``steps_remaining`` counts its jobs not completed: counted
  down by ``job.complete`` in the statement that completes the run at zero
  (``run.complete``), and set again by the resets of a retry (``job.reset*``); a retry
  that leaves nothing to run completes the run at once (``run.complete_restarted``). A
  map node's expansion adds its items to the count in the statement that inserts them
  (:mod:`cyclone._store.fanout`); each item is then counted down as any job.
- A map node parked by ``job.fan_out`` (blocked) has ``pending_deps`` equal to its items
  not completed: counted under the run's lock when it parks, then down by each item's
  ``job.complete``; a completed map node has exactly one completed item per element of
  its output.
- A running job has an owner and a lease: ``job.claim`` and ``job.continue`` set them; the releases
  (``job.hand_back``, ``job.rescue``, ``job.park``, ``job.park_blocked``,
  ``job.cancel_ended``, ``job.cancel_ended_park``) clear the owner and move the lease on,
  so an outcome the execution records late is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cyclone._store import (
    children,
    claim,
    completion,
    control,
    fanout,
    rescue,
    standalone,
    waits,
)
from cyclone.schema import jobs
from cyclone.states import TERMINAL_RUN_STATES, RunState


def retry_run_stmt() -> Any:
    """Restart a failed or cancelled run (:meth:`cyclone.Run.retry`)."""
    return control.restart_run_stmt(from_states=(RunState.FAILED, RunState.CANCELLED))


def retry_any_run_stmt() -> Any:
    """Restart a run in any terminal state (``retry_all``)."""
    return control.restart_run_stmt(from_states=tuple(TERMINAL_RUN_STATES))


def reset_failed_steps_stmt() -> Any:
    """Make a retried run's failed and cancelled steps runnable again."""
    return control.reset_jobs_stmt(every_step=False)


def reset_every_step_stmt() -> Any:
    """Make every step of a run retried with ``retry_all`` runnable again."""
    return control.reset_jobs_stmt(every_step=True)


def release_any_jobs_stmt() -> Any:
    """The one release of running jobs (a hand-back, a rescue), for any jobs chosen."""
    return rescue.release_jobs_stmt(jobs.select().with_only_columns(jobs.c.id).scalar_subquery())


BUILDERS: dict[str, Callable[[], Any]] = {
    # runs
    "run.complete": claim.record_jobs_stmt,
    "run.complete_restarted": control.complete_restarted_run_stmt,
    "run.fail": completion.fail_run_stmt,
    "run.expire": rescue.expire_runs_stmt,
    "run.cancel": control.cancel_run_stmt,
    "run.retry": retry_run_stmt,
    "run.retry_all": retry_any_run_stmt,
    # jobs
    "job.unblock": claim.record_jobs_stmt,
    "job.claim": claim._record_and_claim_one,
    "job.continue": claim._record_and_claim_one,
    "job.complete": claim.record_jobs_stmt,
    "job.retry_attempt": completion.retry_job_stmt,
    "job.cancel_ended_attempt": completion.retry_job_stmt,
    "job.fail": completion.fail_job_stmt,
    "job.cancel_ended": release_any_jobs_stmt,
    "job.rescue": rescue.rescue_jobs_stmt,
    "job.rescue_give_up": rescue.rescue_jobs_stmt,
    "job.hand_back": rescue.hand_back_stmt,
    "job.park": waits.park_stmt,
    "job.park_blocked": waits.park_stmt,
    "job.wake_parent": children.wake_stmt,
    "job.repark_item": children.repark_stmt,
    "job.fan_out": fanout.fan_out_stmt,
    "job.fail_map_node": completion.fail_map_node_stmt,
    "job.cancel_ended_park": waits.end_parked_stmt,
    "job.cancel": standalone.cancel_job_stmt,
    "job.retry": standalone.retry_standalone_job_stmt,
    "job.cancel_unstarted": completion.cancel_unstarted_stmt,
    "job.cancel_unstarted_expired": rescue.expire_runs_stmt,
    "job.reset": reset_failed_steps_stmt,
    "job.reset_blocked": reset_failed_steps_stmt,
    "job.reset_all": reset_every_step_stmt,
    "job.reset_all_blocked": reset_every_step_stmt,
}
"""For each edge of :data:`cyclone.states.EDGES` by key, the builder of its statement."""

OWNERS = (children, claim, completion, control, fanout, rescue, standalone, waits)
"""The store's modules whose statements change a run's or a job's state."""
