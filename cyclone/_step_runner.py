"""Run one claimed job: decode its input, call the step, classify the outcome. No SQL."""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from cyclone import _codec, _observe
from cyclone._retry import Backoff
from cyclone._store.claim import Claimed
from cyclone._store.completion import Failure, Success
from cyclone.context import StepContext

if TYPE_CHECKING:
    from cyclone.workflow import StandaloneStep, Workflow

log = logging.getLogger("cyclone.worker")


class _Permanent(Exception):
    """An error that no retry can mend."""


class StepNotDefined(_Permanent):
    """The job's step is not defined in this worker (a redeploy removed it)."""


class InputNotDecodable(_Permanent):
    """The stored input no longer decodes as the step's input type."""


def _storable(text: str) -> str:
    """Text that jsonb accepts: no NUL, no lone surrogates."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _error_record(exc: BaseException, job: Claimed) -> dict[str, Any]:
    return {
        "type": _storable(type(exc).__qualname__),
        "message": _storable(str(exc)),
        "traceback": _storable("".join(traceback.format_exception(exc))),
        "attempt": job.attempt,
        "step": job.kind,
        "at": datetime.now(UTC).isoformat(),
    }


@_observe.attempts
def execute(
    job: Claimed,
    engine: Engine,
    workflows: Mapping[str, Workflow[Any]],
    steps: Mapping[str, StandaloneStep[Any, Any]],
    backoff: Backoff,
    step_context: Callable[[], AbstractContextManager[object]] | None = None,
) -> Success | Failure:
    """Run ``job`` and return what to record; never raises for the step's own errors.

    ``step_context``, when given, is entered around the step's call (an application's
    context); what it raises counts as the step's error.
    """
    started = time.perf_counter()
    try:
        fn, input_type, output_type = _resolve(job, workflows, steps)
        try:
            value = _codec.decode(job.input or "null", input_type)
        except Exception as exc:
            raise InputNotDecodable(
                f"stored input does not decode as {input_type!r}: {exc}"
            ) from exc
        ctx = StepContext(
            engine=engine,
            job_id=job.id,
            run_id=job.run_id,
            workflow=job.workflow,
            step=job.kind,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            input=value,
            deadline=job.deadline,
            upstream=dict(job.upstream),
            lease=job.lease,
        )
        if step_context is None:
            result = fn(ctx, value)
        else:
            with step_context():
                result = fn(ctx, value)
        output = _codec.encode(result, what=f"output of step {job.kind!r}", type_=output_type)
    except Exception as exc:
        duration = time.perf_counter() - started
        permanent = isinstance(exc, _Permanent)
        retry_in = None if permanent or job.attempt >= job.max_attempts else backoff(job.attempt)
        outcome = "failed" if retry_in is None else "retrying"
        fields = {**_fields(job), "duration": duration, "outcome": outcome}
        if retry_in is None:
            log.error(
                "%s failed for good on attempt %d/%d after %.3fs: %r",
                describe(job),
                job.attempt,
                job.max_attempts,
                duration,
                exc,
                exc_info=exc,
                extra=fields,
            )
            return Failure(job.id, job.lease, _error_record(exc, job), retry_in)
        failed = (describe(job), job.attempt, job.max_attempts, duration, repr(exc))

        def report(retried: bool) -> None:
            """Log the attempt once it is recorded: retried, or not since its run ended."""
            if retried:
                log.warning(
                    "%s failed on attempt %d/%d after %.3fs: %s; retrying in %.2fs",
                    *failed,
                    retry_in,
                    extra=fields,
                )
            else:
                log.warning(
                    "%s failed on attempt %d/%d after %.3fs: %s; its run has ended, "
                    "so it is not retried",
                    *failed,
                    extra={**fields, "outcome": "run ended"},
                )

        return Failure(job.id, job.lease, _error_record(exc, job), retry_in, report)
    if log.isEnabledFor(logging.INFO):
        duration = time.perf_counter() - started
        log.info(
            "%s completed on attempt %d/%d in %.3fs",
            describe(job),
            job.attempt,
            job.max_attempts,
            duration,
            extra={**_fields(job), "duration": duration, "outcome": "completed"},
        )
    return Success(job.id, job.lease, output)


def _fields(job: Claimed) -> dict[str, Any]:
    """The structured fields of a step's log lines."""
    return {
        "run_id": str(job.run_id),
        "workflow": job.workflow,
        "step": job.kind,
        "attempt": job.attempt,
        "job_id": job.id,
    }


def describe(job: Claimed) -> str:
    """How log lines name a job: its workflow, step and run, or its kind and id."""
    if job.workflow is not None:
        return f"workflow {job.workflow} step {job.kind} run {job.run_id}"
    return f"job {job.kind} #{job.id}"


def _resolve(
    job: Claimed,
    workflows: Mapping[str, Workflow[Any]],
    steps: Mapping[str, StandaloneStep[Any, Any]],
) -> tuple[Any, Any, Any]:
    if job.workflow is not None:
        workflow = workflows.get(job.workflow)
        node = workflow.steps.get(job.kind) if workflow is not None else None
        if workflow is None or node is None:
            raise StepNotDefined(
                f"step {job.kind!r} is not defined in this worker's workflow {job.workflow!r} "
                "(was it removed by a redeploy?)"
            )
        # A wait node is called with its signal's payload instead of the run's input.
        input_type = workflow.input_type if node.signal is None else node.payload_type
        # A child node's function returns its child's input.
        return node.fn, input_type, node.produces
    standalone = steps.get(job.kind)
    if standalone is None:
        raise StepNotDefined(f"step kind {job.kind!r} is not defined in this worker")
    return standalone.fn, standalone.args_type, standalone.output_type
