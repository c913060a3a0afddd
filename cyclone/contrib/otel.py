"""OpenTelemetry tracing and metrics for cyclone (the ``cyclone[otel]`` extra).

``instrument()`` installs an observer on cyclone's hooks. Spans: one per submit or enqueue
(``cyclone submit <workflow>``, a producer span), and for every claimed job one for its
claim (``cyclone claim <workflow>.<step>``) and one for its attempt (``cyclone step
<workflow>.<step>``), both children of the context stored with the run at submit, so a
request and the steps it caused are one trace; and one per signal sent (``cyclone signal
<workflow>.<signal>``, a producer span whose ``cyclone.signal.accepted`` is True when the
send stored the signal). Metrics: ``cyclone.step.finished`` and ``cyclone.step.failed``
(counters of attempts), ``cyclone.step.duration`` (a histogram, in seconds) and
``cyclone.backlog`` (an observable gauge of jobs waiting per queue, reported by processes
that run a worker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import cyclone
from cyclone import _observe
from cyclone.client import Client
from cyclone.errors import MissingExtraError

with MissingExtraError.guard(__name__, "otel"):
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = ["instrument", "uninstrument"]

SCOPE = "cyclone"

_propagator = TraceContextTextMapPropagator()


def _name(workflow: str | None, step: str) -> str:
    return step if workflow is None else f"{workflow}.{step}"


def _attributes(attempt: _observe.Attempt) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "cyclone.step": attempt.step,
        "cyclone.queue": attempt.queue,
        "cyclone.job_id": attempt.job_id,
        "cyclone.attempt": attempt.attempt,
        "cyclone.max_attempts": attempt.max_attempts,
    }
    if attempt.workflow is not None:
        attributes["cyclone.workflow"] = attempt.workflow
    if attempt.run_id is not None:
        attributes["cyclone.run_id"] = str(attempt.run_id)
    if attempt.key is not None:
        attributes["cyclone.key"] = attempt.key
    return attributes


def _parent(attempt: _observe.Attempt) -> otel_context.Context:
    """The context stored at submit, or an empty one: never the worker thread's own."""
    if attempt.trace_context is None:
        return otel_context.Context()
    return _propagator.extract({"traceparent": attempt.trace_context}, otel_context.Context())


class _Observer:
    """Turns cyclone's hooks into spans and measurements."""

    def __init__(self, tracer: trace.Tracer, meter: metrics.Meter) -> None:
        self.tracer = tracer
        self.finished = meter.create_counter(
            "cyclone.step.finished",
            unit="{attempt}",
            description="Step attempts that ended, by outcome (completed, retry, failed)",
        )
        self.failed = meter.create_counter(
            "cyclone.step.failed",
            unit="{attempt}",
            description="Step attempts that raised, by outcome (retry, failed)",
        )
        self.duration = meter.create_histogram(
            "cyclone.step.duration", unit="s", description="Duration of step attempts"
        )
        meter.create_observable_gauge(
            "cyclone.backlog",
            callbacks=[_backlog],
            unit="{job}",
            description="Jobs waiting for a worker (available and due), per queue",
        )

    def trace_context(self) -> str | None:
        carrier: dict[str, str] = {}
        _propagator.inject(carrier)
        return carrier.get("traceparent")

    def submit(self, submission: _observe.Submission, call: Callable[[], Any]) -> Any:
        target = submission.workflow or submission.kind or "?"
        attributes: dict[str, Any] = {"cyclone.operation": submission.operation}
        if submission.workflow is not None:
            attributes["cyclone.workflow"] = submission.workflow
        if submission.kind is not None:
            attributes["cyclone.step"] = submission.kind
        if submission.key is not None:
            attributes["cyclone.key"] = submission.key
        if submission.count != 1:
            attributes["cyclone.count"] = submission.count
        with self.tracer.start_as_current_span(
            f"cyclone submit {target}", kind=trace.SpanKind.PRODUCER, attributes=attributes
        ) as span:
            result = call()
            if len(submission.run_ids) == 1:
                made = "cyclone.run_id" if submission.workflow else "cyclone.job_id"
                span.set_attribute(made, str(submission.run_ids[0]))
                span.set_attribute("cyclone.created", submission.created[0])
            else:
                span.set_attribute("cyclone.created_count", sum(submission.created))
            return result

    def claimed(self, worker_id: str, attempts: Sequence[_observe.Attempt], start_ns: int) -> None:
        end_ns = time.time_ns()
        for attempt in attempts:
            attributes = _attributes(attempt)
            attributes["cyclone.worker_id"] = worker_id
            attributes["cyclone.claimed_count"] = len(attempts)
            span = self.tracer.start_span(
                f"cyclone claim {_name(attempt.workflow, attempt.step)}",
                context=_parent(attempt),
                kind=trace.SpanKind.CONSUMER,
                attributes=attributes,
                start_time=start_ns,
            )
            span.end(end_time=end_ns)

    def attempt(
        self, attempt: _observe.Attempt, call: Callable[[], _observe.Outcome]
    ) -> _observe.Outcome:
        metric_attributes = {"cyclone.step": attempt.step}
        if attempt.workflow is not None:
            metric_attributes["cyclone.workflow"] = attempt.workflow
        with self.tracer.start_as_current_span(
            f"cyclone step {_name(attempt.workflow, attempt.step)}",
            context=_parent(attempt),
            kind=trace.SpanKind.CONSUMER,
            attributes=_attributes(attempt),
        ) as span:
            outcome = call()
            span.set_attribute("cyclone.outcome", outcome.outcome)
            if outcome.error is not None:
                span.add_event(
                    "exception",
                    {
                        "exception.type": str(outcome.error.get("type", "")),
                        "exception.message": str(outcome.error.get("message", "")),
                        "exception.stacktrace": str(outcome.error.get("traceback", "")),
                    },
                )
                span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error.get("type")))
        measured = {**metric_attributes, "cyclone.outcome": outcome.outcome}
        self.finished.add(1, measured)
        if outcome.error is not None:
            self.failed.add(1, measured)
        self.duration.record(outcome.seconds, measured)
        return outcome

    def signal(self, sending: _observe.Sending, call: Callable[[], bool]) -> bool:
        attributes: dict[str, Any] = {
            "cyclone.workflow": sending.workflow,
            "cyclone.signal": sending.signal,
        }
        if sending.key is not None:
            attributes["cyclone.key"] = sending.key
        with self.tracer.start_as_current_span(
            f"cyclone signal {sending.workflow}.{sending.signal}",
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
        ) as span:
            try:
                accepted = call()
            except Exception:
                span.set_attribute("cyclone.signal.accepted", False)
                raise
            finally:
                if sending.run_id is not None:
                    span.set_attribute("cyclone.run_id", str(sending.run_id))
            span.set_attribute("cyclone.signal.accepted", accepted)
            return accepted


def _backlog(options: metrics.CallbackOptions) -> Iterable[metrics.Observation]:
    """Jobs waiting per queue, read once per collection from each engine a worker serves."""
    for engine in _observe.served_engines():
        database = engine.url.database or ""
        try:
            backlog = Client(engine).backlog()
        except Exception:  # a database that is down has no backlog to report this time
            continue
        for queue, count in backlog.items():
            yield metrics.Observation(count, {"cyclone.queue": queue, "db.namespace": database})


def instrument(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
) -> None:
    """Trace and measure cyclone in this process (the global providers unless given).

    Call it once per process at start-up, in the web application and in the workers
    alike: each call installs a new observer and creates its instruments on the meter
    provider anew.
    """
    tracer = trace.get_tracer(SCOPE, cyclone.__version__, tracer_provider=tracer_provider)
    meter = metrics.get_meter(SCOPE, cyclone.__version__, meter_provider=meter_provider)
    _observe.install(_Observer(tracer, meter))


def uninstrument() -> None:
    """Stop tracing and measuring; cyclone's hooks go back to costing one global read."""
    _observe.install(None)
