"""Standalone jobs: ``enqueue`` / ``enqueue_tx`` with unique keys, and the ``Job`` handle.

A unique key is held only while its job is active (available, blocked or running); a
partial unique index enforces it, so concurrent enqueues from many processes cannot
both win.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import Engine

from cyclone import _codec, _observe, errors
from cyclone._store import binds as _binds
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits
from cyclone._store import reads as _reads
from cyclone._store import standalone as _standalone
from cyclone.runs import deadline_of, read_within, wait_until_finished
from cyclone.states import TERMINAL_JOB_STATES, JobState

R = TypeVar("R")

_MAX_RACE_RETRIES = 5


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """A validated, encoded enqueue."""

    kind: str
    args: str
    unique: str | None
    run_at: datetime | None
    delay: timedelta | None
    queue: str
    priority: int
    max_attempts: int
    output_type: Any
    limit: dict[str, Any] | None = None
    """The parameters of the kind's limit's row (:func:`cyclone._store.limits.spec_params`)."""
    limit_key: str | None = None
    rate: dict[str, Any] | None = None
    """The parameters of the Rate given with the kind's Concurrency, and its key."""
    rate_key: str | None = None


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A snapshot of one standalone job."""

    id: int
    kind: str
    key: str | None
    queue: str
    priority: int
    state: JobState
    attempt: int
    max_attempts: int
    created_at: datetime
    scheduled_at: datetime
    """The earliest moment its next attempt may start (a delay, a retry's backoff)."""
    finished_at: datetime | None
    """When the job reached a terminal state; None until then."""
    errors: list[dict[str, Any]]

    @property
    def done(self) -> bool:
        """True once the job is completed, failed or cancelled."""
        return self.state in TERMINAL_JOB_STATES

    @property
    def cursor(self) -> str:
        """This job's place in the listing, as text: pass it as ``after=`` to
        ``Client.list_jobs`` (or ``cyclone jobs list --after``) for the jobs after it."""
        return f"{self.created_at.isoformat()}~{self.id}"


class Job(Generic[R]):
    """A handle on one standalone job."""

    def __init__(
        self, engine: Engine, job_id: int, kind: str, key: str | None, output_type: Any = Any
    ) -> None:
        self._engine = engine
        self.id = job_id
        self.kind = kind
        self.key = key
        self.output_type = output_type

    def __repr__(self) -> str:
        return f"<Job {self.id} kind={self.kind!r} key={self.key!r}>"

    def status(self) -> JobStatus:
        """The job's current status.

        Raises:
            NotFoundError: the job was purged, or its transaction did not commit.
        """
        fields = _reads.job_status_now(self._engine, self.id)
        if fields is None:
            raise errors.NotFoundError(f"job {self.id} does not exist (purged, or not committed)")
        return JobStatus(*fields)

    def cancel(self) -> None:
        """Cancel the job if it has not started (a running job finishes its attempt).

        Raises:
            InvalidStateError: the job is running or has ended.
        """
        _standalone.cancel_job(self._engine, self.id)

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Wait until the job is completed, failed or cancelled; return its status.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """

        def read() -> JobStatus | None:
            status = self.status()
            return status if status.done else None

        result: JobStatus = wait_until_finished(self._engine, f"job:{self.id}", timeout, read)
        return result

    def _read_output(self) -> str | None:
        return _reads.job_output(self._engine, self.id)

    def result(self, timeout: float | None = None) -> R:
        """Wait for the job and return its output, decoded to the step's return type.

        Raises:
            RunFailedError: the job failed or was cancelled.
            TimeoutError: ``timeout`` seconds passed first.
        """
        deadline = deadline_of(timeout)
        status = self.wait(timeout)
        if status.state != JobState.COMPLETED:
            raise errors.RunFailedError(
                run_id=self.id,
                workflow=self.kind,
                state=status.state.value,
                step=self.kind,
                error=status.errors[-1] if status.errors else None,
            )
        output = read_within(self._read_output, deadline, f"job:{self.id}")
        value: R = _codec.decode(output or "null", self.output_type)
        return value


def _enqueue(conn: _executor.Executor, engine: Engine, req: EnqueueRequest) -> Job[Any]:
    params = {
        "kind": req.kind,
        "queue": req.queue,
        "priority": req.priority,
        "args": req.args,
        "max_attempts": req.max_attempts,
        "unique": req.unique,
        "run_at": req.run_at,
        "delay": req.delay,
        "trace_context": _observe.trace_context(),
    }
    if req.limit is not None:
        assert req.limit_key is not None
        _limits.ensure_key(conn, req.limit, req.limit_key)
        params["limit_name"] = req.limit["name"]
        params["limit_key"] = req.limit_key
    if req.rate is not None:
        assert req.rate_key is not None
        _limits.ensure_key(conn, req.rate, req.rate_key)
        params["rate_name"] = req.rate["name"]
        params["rate_key"] = req.rate_key
    for _ in range(_MAX_RACE_RETRIES):
        job_id = _standalone.insert_job(conn, params)
        if job_id is not None:
            return Job(engine, job_id, req.kind, req.unique, req.output_type)
        holder = _standalone.holder_of(conn, params)
        if holder is not None:
            assert req.unique is not None
            raise errors.DuplicateError(kind=req.kind, key=req.unique, job_id=holder)
    raise RuntimeError(f"unique key {req.unique!r} kept changing hands while enqueueing")


@_observe.submits
def enqueue(bind: _binds.Bind, req: EnqueueRequest) -> Job[Any]:
    engine = _binds.engine_of(bind)
    with _executor.connect(engine) as conn:
        return _enqueue(conn, engine, req)


@_observe.submits
def enqueue_tx(conn: _binds.Conn, req: EnqueueRequest) -> Job[Any]:
    executor, engine = _binds.joined(conn)
    return _enqueue(executor, engine, req)
