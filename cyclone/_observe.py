"""Observability hooks: the core reports submits, claims and step attempts to one observer.

Dependency-free: an integration (``cyclone.contrib.otel``) installs an :class:`Observer`;
with none installed each hook is one global read and a direct call, and no trace context
is stored. The core calls the hooks through the decorators :func:`submits`,
:func:`claims`, :func:`attempts` and :func:`signals`, and :func:`trace_context` for the
value stored with a new run or job.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from cyclone._store.claim import Claimed

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True)
class Submission:
    """One submit or enqueue: what it asked for, and (once it returned) what it made."""

    operation: str
    workflow: str | None
    kind: str | None
    key: str | None
    count: int
    run_ids: list[uuid.UUID | int]
    created: list[bool]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One claimed job as an observer sees it."""

    job_id: int
    run_id: uuid.UUID | None
    workflow: str | None
    step: str
    queue: str
    key: str | None
    attempt: int
    max_attempts: int
    trace_context: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an attempt ended: ``completed``, ``retry`` (it raised and runs again) or ``failed``."""

    outcome: str
    seconds: float
    error: dict[str, Any] | None


class Observer(Protocol):
    """What an integration implements; each method is called only while it is installed."""

    def trace_context(self) -> str | None:
        """The W3C ``traceparent`` of the current context, to store with a new run or job."""

    def submit(self, submission: Submission, call: Callable[[], Any]) -> Any:
        """Run ``call`` (the submit) and return its result; it fills ``submission`` in."""

    def claimed(self, worker_id: str, attempts: Sequence[Attempt], start_ns: int) -> None:
        """``attempts`` were claimed by one statement that began at ``start_ns`` (epoch ns)."""

    def attempt(self, attempt: Attempt, call: Callable[[], Outcome]) -> Outcome:
        """Run ``call`` (one step attempt, which never raises for the step's errors)."""

    def signal(self, sending: Sending, call: Callable[[], bool]) -> bool:
        """Run ``call`` (one send of a signal, which may raise) and return its result."""


_observer: Observer | None = None
_workers: weakref.WeakSet[Any] = weakref.WeakSet()


def install(observer: Observer | None) -> None:
    """Make ``observer`` the one that receives the hooks (None: no observer)."""
    global _observer
    _observer = observer


def installed() -> Observer | None:
    return _observer


def serving(worker: Any) -> None:
    """Remember a worker of this process (held weakly) until :func:`retired`: the backlog
    gauge reads the database of each. A worker is remembered once made, and again while
    each :meth:`~cyclone.Worker.run` or :meth:`~cyclone.Worker.drain` of it lasts."""
    _workers.add(worker)


def retired(worker: Any) -> None:
    """The worker was closed, or its run or drain returned: its engine may be disposed,
    so no gauge reads through it (a read would reopen a connection of its pool)."""
    _workers.discard(worker)


def served_engines() -> list[Engine]:
    """The engines of this process's open workers, each once."""
    engines: dict[int, Engine] = {}
    for worker in list(_workers):
        engines.setdefault(id(worker.engine), worker.engine)
    return list(engines.values())


def trace_context() -> str | None:
    """The traceparent to store with a new run or job; None when nothing is installed."""
    observer = _observer
    return None if observer is None else observer.trace_context()


def _submission(operation: str, arguments: dict[str, Any]) -> Submission:
    plan, req = arguments.get("plan"), arguments.get("req")
    items = arguments.get("items")
    key = arguments.get("key")
    if req is not None:
        key = req.unique
    return Submission(
        operation=operation,
        workflow=None if plan is None else plan.workflow,
        kind=None if req is None else req.kind,
        key=key,
        count=1 if items is None else len(items),
        run_ids=[],
        created=[],
    )


def _record(submission: Submission, result: Any) -> None:
    for made in result if isinstance(result, list) else [result]:
        submission.run_ids.append(getattr(made, "run_id", None) or made.id)
        submission.created.append(getattr(made, "created", True))


def submits(fn: F) -> F:
    """Report each call of a submit or enqueue function (``plan``/``req``, ``key``, ``items``)."""
    signature = inspect.signature(fn)
    operation = fn.__name__

    @functools.wraps(fn)
    def observed(*args: Any, **kwargs: Any) -> Any:
        observer = _observer
        if observer is None:
            return fn(*args, **kwargs)
        submission = _submission(operation, signature.bind(*args, **kwargs).arguments)

        def call() -> Any:
            result = fn(*args, **kwargs)
            _record(submission, result)
            return result

        return observer.submit(submission, call)

    return observed  # type: ignore[return-value]


def _attempt(job: Claimed) -> Attempt:
    return Attempt(
        job_id=job.id,
        run_id=job.run_id,
        workflow=job.workflow,
        step=job.kind,
        queue=job.queue,
        key=job.key,
        attempt=job.attempt,
        max_attempts=job.max_attempts,
        trace_context=job.trace_context,
    )


def claims(fn: F) -> F:
    """Report the jobs each call of the claim function (``worker_id=``) returned: its
    result is the list of jobs claimed, or a tuple whose last item is."""

    @functools.wraps(fn)
    def observed(*args: Any, **kwargs: Any) -> Any:
        observer = _observer
        if observer is None:
            return fn(*args, **kwargs)
        start_ns = time.time_ns()
        result = fn(*args, **kwargs)
        claimed: list[Claimed] = result[-1] if isinstance(result, tuple) else result
        if claimed:
            worker_id = str(kwargs.get("worker_id", ""))
            observer.claimed(worker_id, [_attempt(job) for job in claimed], start_ns)
        return result

    return observed  # type: ignore[return-value]


def _outcome(result: Any, seconds: float) -> Outcome:
    error = getattr(result, "error", None)
    if error is None:
        return Outcome("completed", seconds, None)
    return Outcome("failed" if result.retry_in is None else "retry", seconds, error)


def attempts(fn: F) -> F:
    """Report each step attempt run by the execute function (its first argument the job)."""

    @functools.wraps(fn)
    def observed(job: Claimed, *args: Any, **kwargs: Any) -> Any:
        observer = _observer
        if observer is None:
            return fn(job, *args, **kwargs)
        results: list[Any] = []

        def call() -> Outcome:
            started = time.perf_counter()
            results.append(fn(job, *args, **kwargs))
            return _outcome(results[0], time.perf_counter() - started)

        observer.attempt(_attempt(job), call)
        return results[0]

    return observed  # type: ignore[return-value]


@dataclass(slots=True)
class Sending:
    """One send of a signal; ``run_id`` is filled in once the run is found (by key)."""

    workflow: str
    signal: str
    key: str | None
    run_id: Any


_sending: contextvars.ContextVar[Sending | None] = contextvars.ContextVar("cyclone_sending")


def signals(fn: F) -> F:
    """Report each send of a signal by the send function (``workflow``, ``key``, ``run_id``,
    ``signal`` keywords); it calls :func:`found` with the run's id."""

    @functools.wraps(fn)
    def observed(*args: Any, **kwargs: Any) -> Any:
        observer = _observer
        if observer is None:
            return fn(*args, **kwargs)
        sending = Sending(kwargs["workflow"], kwargs["signal"], kwargs["key"], kwargs["run_id"])
        token = _sending.set(sending)
        try:
            return observer.signal(sending, lambda: fn(*args, **kwargs))
        finally:
            _sending.reset(token)

    return observed  # type: ignore[return-value]


def found(run_id: Any) -> None:
    """The signal being sent (if observed) goes to the run ``run_id``."""
    sending = _sending.get(None)
    if sending is not None:
        sending.run_id = run_id
