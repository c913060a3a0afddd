"""The run and job state machines, declared once; the database enforces them with CHECKs.

Run::

    running --> completed
       |------> failed    --(retry / retry_all)--> running
       '------> cancelled --(retry / retry_all)--> running

Job (one step of a run, or a standalone job)::

    blocked --(all predecessors completed)--> available --(claimed)--> running
    running --(ok)--> completed
    running --(raised, attempts left)--> available (scheduled_at = now + backoff)
    running --(raised, no attempts left)--> failed
    blocked / available --(run failed, cancelled or past its deadline)--> cancelled
"""

from __future__ import annotations

from enum import StrEnum


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


TERMINAL_RUN_STATES: frozenset[RunState] = frozenset(
    {RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED}
)
TERMINAL_JOB_STATES: frozenset[JobState] = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
)
ACTIVE_JOB_STATES: frozenset[JobState] = frozenset(JobState) - TERMINAL_JOB_STATES
