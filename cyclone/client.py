"""``Client``: list and read runs and jobs (keyset pagination), counts, and purging."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import (
    Engine,
    Text,
    bindparam,
    cast,
    func,
    literal_column,
    select,
    tuple_,
    union_all,
)

from cyclone import _binds, _codec, _lookup, _sweeper, _unstarted, schedules
from cyclone.jobs import JOB_STATUS_COLUMNS, JobStatus, cancel_job, job_status_from_row
from cyclone.runs import STATUS_COLUMNS, RunStatus, status_from_row
from cyclone.schedules import ScheduleStatus
from cyclone.schema import LISTED_SINCE, jobs, runs
from cyclone.states import JobState, RunState

DEFAULT_PAGE = 100


@dataclass(frozen=True, slots=True)
class StepStatus:
    """One step of a run as its job stands: state, attempts, timing and every error.

    Each error is a dict with ``type``, ``message``, ``traceback``, ``attempt`` and ``at``.
    """

    name: str
    job_id: int | None
    """None while the run has not started: its steps are created when a worker starts it."""
    state: JobState
    queue: str
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    errors: list[dict[str, Any]]

    @property
    def duration(self) -> timedelta | None:
        """How long the last attempt took, once it has ended."""
        if self.started_at is None or self.finished_at is None:
            return None
        return max(self.finished_at - self.started_at, timedelta())


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run with its input, its result node's output (if any) and its steps in order."""

    status: RunStatus
    input: Any
    result_step: str | None
    result: Any
    steps: list[StepStatus]


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A standalone job with its arguments, its output and when its last attempt started."""

    status: JobStatus
    args: Any
    output: Any
    started_at: datetime | None


_RUN_DATA = select(cast(runs.c.input, Text), runs.c.result_step).where(runs.c.id == bindparam("id"))
_STEP_COLUMNS = (
    "kind",
    "id",
    "state",
    "queue",
    "attempt",
    "max_attempts",
    "scheduled_at",
    "attempted_at",
    "finalized_at",
    "errors",
    "output",
)
_STEPS_CREATED = select(*(jobs.c[n] for n in _STEP_COLUMNS), jobs.c.id.label("ord")).where(
    jobs.c.run_id == bindparam("id")
)
_UNSTARTED = _unstarted.steps_of(bindparam("id")).subquery("unstarted")
_STEPS_ALL = union_all(
    _STEPS_CREATED, select(*(_UNSTARTED.c[n] for n in (*_STEP_COLUMNS, "ord")))
).subquery("steps")
_STEPS = select(
    *(
        cast(_STEPS_ALL.c[n], Text) if n in ("errors", "output") else _STEPS_ALL.c[n]
        for n in _STEP_COLUMNS
    )
).order_by(_STEPS_ALL.c.ord)
"""A run's steps in order: its jobs, or, for a run not started yet, its graph's steps."""
_JOB_DATA = select(
    *JOB_STATUS_COLUMNS, cast(jobs.c.args, Text), cast(jobs.c.output, Text), jobs.c.attempted_at
).where(jobs.c.id == bindparam("id"), jobs.c.run_id.is_(None))


def _json(text: str | None) -> Any:
    return None if text is None else _codec.decode(text)


class HasName(Protocol):
    """Anything with a ``name``, such as a Workflow."""

    @property
    def name(self) -> str: ...


class Client:
    """Wraps an Engine; every workflow method that takes an Engine also takes a Client.

    Example:
        client = cyclone.Client(engine)
        failed = client.list_runs(workflow="checkout", state=cyclone.RunState.FAILED)
    """

    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(f"Client takes a SQLAlchemy Engine, not {type(engine).__name__}")
        self._engine = engine

    @property
    def engine(self) -> Engine:
        return self._engine

    def __repr__(self) -> str:
        return f"<cyclone.Client {self._engine.url!r}>"

    def list_runs(
        self,
        *,
        workflow: str | None = None,
        state: RunState | str | None = None,
        key: str | None = None,
        since: datetime | None = None,
        limit: int = DEFAULT_PAGE,
        after: RunStatus | None = None,
    ) -> list[RunStatus]:
        """Runs newest first. Pass the last run of a page as ``after`` for the next page.

        ``since`` (an aware datetime) keeps runs created at or after it.

        Pagination is by ``(created_at, id)``, so pages neither repeat nor skip runs
        while new runs are submitted.
        """
        stmt = select(*STATUS_COLUMNS)
        if workflow is not None:
            # Always true: it lets the planner use the partial (workflow, created_at, id) index.
            stmt = stmt.where(
                runs.c.workflow == workflow,
                runs.c.created_at > literal_column(LISTED_SINCE, runs.c.created_at.type),
            )
        if state is not None:
            stmt = stmt.where(runs.c.state == RunState(state).value)
        if key is not None:
            stmt = stmt.where(runs.c.submit_key == key)
        if since is not None:
            stmt = stmt.where(runs.c.created_at >= _aware(since))
        if after is not None:
            stmt = stmt.where(tuple_(runs.c.created_at, runs.c.id) < (after.created_at, after.id))
        stmt = stmt.order_by(runs.c.created_at.desc(), runs.c.id.desc()).limit(_limit(limit))
        with _binds.autocommit(self._engine) as conn:
            return [status_from_row(row) for row in conn.execute(stmt)]

    def iter_runs(self, *, page_size: int = DEFAULT_PAGE, **filters: Any) -> Iterator[RunStatus]:
        """Every run matching the filters of :meth:`list_runs`, newest first, page by page."""
        after: RunStatus | None = None
        while True:
            page = self.list_runs(limit=page_size, after=after, **filters)
            yield from page
            if len(page) < page_size:
                return
            after = page[-1]

    def get_run(self, run_id: uuid.UUID | str) -> RunStatus | None:
        """The run with this id, or None."""
        run_uuid = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
        with _binds.autocommit(self._engine) as conn:
            row = conn.execute(
                select(*STATUS_COLUMNS).where(runs.c.id == bindparam("id")), {"id": run_uuid}
            ).first()
        return None if row is None else status_from_row(row)

    def get_run_detail(self, run_id: uuid.UUID | str) -> RunDetail | None:
        """The run with its input, result and steps (one snapshot), or None."""
        run_uuid = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
        snapshot = self._engine.connect().execution_options(isolation_level="REPEATABLE READ")
        with snapshot as conn, conn.begin():
            status_row = conn.execute(
                select(*STATUS_COLUMNS).where(runs.c.id == bindparam("id")), {"id": run_uuid}
            ).first()
            if status_row is None:
                return None
            data = conn.execute(_RUN_DATA, {"id": run_uuid}).one()
            step_rows = conn.execute(_STEPS, {"id": run_uuid}).all()
        steps = [
            StepStatus(
                name=row[0],
                job_id=row[1],
                state=JobState(row[2]),
                queue=row[3],
                attempt=row[4],
                max_attempts=row[5],
                scheduled_at=row[6],
                started_at=row[7],
                finished_at=row[8],
                errors=_codec.decode(row[9]),
            )
            for row in step_rows
        ]
        outputs = {row[0]: row[10] for row in step_rows}
        result_step = data[1]
        return RunDetail(
            status=status_from_row(status_row),
            input=_json(data[0]),
            result_step=result_step,
            result=_json(outputs.get(result_step)) if result_step else None,
            steps=steps,
        )

    def get_job_detail(self, job_id: int) -> JobDetail | None:
        """The standalone job with its arguments and output, or None."""
        with _binds.autocommit(self._engine) as conn:
            row = conn.execute(_JOB_DATA, {"id": job_id}).first()
        if row is None:
            return None
        width = len(JOB_STATUS_COLUMNS)
        return JobDetail(
            status=job_status_from_row(row),
            args=_json(row[width]),
            output=_json(row[width + 1]),
            started_at=row[width + 2],
        )

    def cancel_job(self, job_id: int) -> None:
        """Cancel a standalone job that has not started.

        Raises:
            NotFoundError: no standalone job has this id.
            InvalidStateError: the job is running or has ended.
        """
        cancel_job(self._engine, job_id)

    def get_run_by_key(self, workflow: str | HasName, key: str) -> RunStatus | None:
        """The run of ``key`` of ``workflow`` (a name, or a Workflow), or None; one statement."""
        name = workflow if isinstance(workflow, str) else workflow.name
        return _lookup.status_by_key(self._engine, name, key)

    def list_schedules(self) -> list[ScheduleStatus]:
        """Every schedule registered by a worker, by name, with its last and next tick."""
        return schedules.list_all(self._engine)

    def pause_schedule(self, name: str) -> None:
        """Stop firing schedule ``name`` (its ticks while paused are never fired).

        Raises:
            NotFoundError: no schedule of that name is registered.
        """
        schedules.set_paused(self._engine, name, True)

    def resume_schedule(self, name: str) -> None:
        """Fire schedule ``name`` again, from its next tick on.

        Raises:
            NotFoundError: no schedule of that name is registered.
        """
        schedules.set_paused(self._engine, name, False)

    def list_jobs(
        self,
        *,
        kind: str | None = None,
        state: JobState | str | None = None,
        queue: str | None = None,
        limit: int = DEFAULT_PAGE,
        after: JobStatus | None = None,
    ) -> list[JobStatus]:
        """Standalone jobs newest first, paginated like :meth:`list_runs`."""
        stmt = select(*JOB_STATUS_COLUMNS).where(jobs.c.run_id.is_(None))
        if kind is not None:
            stmt = stmt.where(jobs.c.kind == kind)
        if state is not None:
            stmt = stmt.where(jobs.c.state == JobState(state).value)
        if queue is not None:
            stmt = stmt.where(jobs.c.queue == queue)
        if after is not None:
            stmt = stmt.where(tuple_(jobs.c.created_at, jobs.c.id) < (after.created_at, after.id))
        stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(_limit(limit))
        with _binds.autocommit(self._engine) as conn:
            return [job_status_from_row(row) for row in conn.execute(stmt)]

    def get_job(self, job_id: int) -> JobStatus | None:
        """The standalone job with this id, or None."""
        with _binds.autocommit(self._engine) as conn:
            row = conn.execute(
                select(*JOB_STATUS_COLUMNS).where(jobs.c.id == job_id, jobs.c.run_id.is_(None))
            ).first()
        return None if row is None else job_status_from_row(row)

    def count_runs(self, *, workflow: str | None = None) -> dict[RunState, int]:
        """Runs per state (every state present, zero included), for a dashboard."""
        stmt = select(runs.c.state, func.count()).group_by(runs.c.state)
        if workflow is not None:
            stmt = stmt.where(runs.c.workflow == workflow)
        counts = dict.fromkeys(RunState, 0)
        with _binds.autocommit(self._engine) as conn:
            for state, count in conn.execute(stmt):
                counts[RunState(state)] = count
        return counts

    def count_jobs(self, *, queue: str | None = None) -> dict[JobState, int]:
        """Jobs (workflow steps and standalone) per state, for a dashboard.

        The steps of a run not started yet count as it shows them: roots available, the
        others blocked.
        """
        pending = _unstarted.pending_steps().subquery("pending")
        every = union_all(
            select(jobs.c.state, jobs.c.queue), select(pending.c.state, pending.c.queue)
        )
        rows = every.subquery("every")
        stmt = select(rows.c.state, func.count()).group_by(rows.c.state)
        if queue is not None:
            stmt = stmt.where(rows.c.queue == queue)
        counts = dict.fromkeys(JobState, 0)
        with _binds.autocommit(self._engine) as conn:
            for state, count in conn.execute(stmt):
                counts[JobState(state)] = count
        return counts

    def count_purgeable(self, *, older_than: timedelta) -> tuple[int, int]:
        """How many runs and standalone jobs a purge with ``older_than`` would delete now."""
        return _sweeper.count_due(self._engine, older_than)

    def backlog(self) -> dict[str, int]:
        """Jobs waiting for a worker (available and due), per queue that has any; the roots of
        runs not started yet, due, count."""
        pending = _unstarted.pending_steps().subquery("pending")
        waiting = union_all(
            select(jobs.c.queue).where(
                jobs.c.state == JobState.AVAILABLE.value, jobs.c.scheduled_at <= func.now()
            ),
            select(pending.c.queue).where(
                pending.c.state == JobState.AVAILABLE.value, pending.c.scheduled_at <= func.now()
            ),
        ).subquery("waiting")
        stmt = select(waiting.c.queue, func.count()).group_by(waiting.c.queue)
        with _binds.autocommit(self._engine) as conn:
            return {queue: count for queue, count in conn.execute(stmt)}

    def purge_terminal_runs(
        self,
        *,
        older_than: timedelta,
        batch_size: int = _sweeper.DEFAULT_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete runs that ended more than ``older_than`` ago (or their own ``retention``).

        A run's own retention, when set, replaces ``older_than`` for it. Deletes in
        batches of ``batch_size``, frees the deleted runs' keys, and returns how many runs
        it deleted. Running runs are never deleted. ``progress`` is called with the
        number deleted after each batch.
        """
        return _sweeper.purge_runs(self._engine, older_than, batch_size, progress)

    def purge_finished_jobs(
        self,
        *,
        older_than: timedelta,
        batch_size: int = _sweeper.DEFAULT_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete standalone jobs that ended more than ``older_than`` ago; returns how many."""
        return _sweeper.purge_jobs(self._engine, older_than, batch_size, progress)


def _aware(moment: datetime) -> datetime:
    if not isinstance(moment, datetime) or moment.tzinfo is None:
        raise ValueError("since must be an aware datetime")
    return moment


def _limit(limit: int) -> int:
    if not isinstance(limit, int) or limit < 1:
        raise ValueError("limit must be a positive int")
    return limit
