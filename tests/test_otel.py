"""Tracing and metrics (cyclone.contrib.otel) through the OpenTelemetry SDK in-memory exporters."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from opentelemetry.instrumentation.flask import FlaskInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.engine import URL

import cyclone
from cyclone import _observe
from cyclone.contrib import otel
from cyclone.schema import jobs, runs
from tests.support import docs


class Telemetry:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def spans(self, prefix: str = "") -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith(prefix)]

    def points(self, metric: str) -> list[Any]:
        data = self.reader.get_metrics_data()
        assert data is not None
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for m in scope.metrics
            if m.name == metric
            for point in m.data.data_points
        ]


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    t = Telemetry()
    otel.instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    yield t
    otel.uninstrument()
    t.meter_provider.shutdown()
    t.tracer_provider.shutdown()


def shop(name: str) -> tuple[cyclone.Workflow[Any], Any, Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def reserve(ctx: cyclone.StepContext, order: Any) -> int:
        return int(order["quantity"])

    @wf.step(after=[reserve])
    def charge(ctx: cyclone.StepContext, order: Any) -> int:
        return ctx.output(reserve) * 250

    return wf, reserve, charge


def flask_app(engine: sa.Engine, wf: cyclone.Workflow[Any], telemetry: Telemetry) -> flask.Flask:
    app = flask.Flask(__name__)

    @app.post("/orders/<int:order_id>")
    def create(order_id: int) -> dict[str, Any]:
        run, created = wf.submit_once(engine, f"order:{order_id}", flask.request.get_json())
        return {"run_id": str(run.id), "created": created}

    FlaskInstrumentor().instrument_app(app, tracer_provider=telemetry.tracer_provider)
    return app


def stored_trace_context(engine: sa.Engine, run_id: str) -> str | None:
    with engine.connect() as conn:
        value: str | None = conn.execute(
            sa.select(runs.c.trace_context).where(runs.c.id == uuid.UUID(run_id))
        ).scalar_one()
        return value


def test_a_flask_request_and_the_steps_it_caused_are_one_trace(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    wf, _, _ = shop(name)
    app = flask_app(engine, wf, telemetry)
    response = app.test_client().post("/orders/7", json={"quantity": 2})
    assert response.status_code == 200
    run_id = response.get_json()["run_id"]

    assert cyclone.Worker(engine, workflows=[wf]).drain() == 2

    (request,) = telemetry.spans("POST")
    (submit,) = telemetry.spans("cyclone submit")
    claims = telemetry.spans("cyclone claim")
    steps = telemetry.spans("cyclone step")
    assert request.context is not None
    assert submit.context is not None
    trace_id = request.context.trace_id
    for span in [submit, *claims, *steps]:
        assert span.context is not None
        assert span.context.trace_id == trace_id, span.name
    assert submit.parent is not None
    assert submit.parent.span_id == request.context.span_id
    assert submit.kind is SpanKind.PRODUCER
    assert submit.name == f"cyclone submit {name}"
    assert submit.attributes is not None
    assert submit.attributes["cyclone.workflow"] == name
    assert submit.attributes["cyclone.key"] == "order:7"
    assert submit.attributes["cyclone.run_id"] == run_id
    assert submit.attributes["cyclone.created"] is True
    # The run keeps the submit span's context, so its steps are the submit's children.
    stored = stored_trace_context(engine, run_id)
    assert stored is not None
    assert stored.startswith(f"00-{trace_id:032x}-{submit.context.span_id:016x}-")
    assert sorted(s.name for s in steps) == [
        f"cyclone step {name}.charge",
        f"cyclone step {name}.reserve",
    ]
    assert sorted(s.name for s in claims) == [
        f"cyclone claim {name}.charge",
        f"cyclone claim {name}.reserve",
    ]
    for span in [*claims, *steps]:
        assert span.parent is not None
        assert span.parent.span_id == submit.context.span_id
        assert span.attributes is not None
        assert span.attributes["cyclone.workflow"] == name
        assert span.attributes["cyclone.run_id"] == run_id
        assert span.attributes["cyclone.key"] == "order:7"
        assert span.attributes["cyclone.attempt"] == 1
    for span in steps:
        assert span.attributes is not None
        assert span.attributes["cyclone.outcome"] == "completed"
        assert span.kind is SpanKind.CONSUMER


def test_a_retried_attempt_and_a_final_failure_are_counted_and_marked_as_errors(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(max_attempts=2)
    def flaky(ctx: cyclone.StepContext, value: Any) -> None:
        raise ValueError(f"attempt {ctx.attempt} broke")

    wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf], backoff=lambda attempt: 0.0)
    assert worker.drain() + worker.drain() == 2

    steps = sorted(
        telemetry.spans("cyclone step"),
        key=lambda s: s.attributes["cyclone.attempt"] if s.attributes else 0,
    )
    assert [s.attributes and s.attributes["cyclone.outcome"] for s in steps] == ["retry", "failed"]
    for span in steps:
        assert span.status.status_code is StatusCode.ERROR
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert "broke" in str(event.attributes["exception.message"])
        assert "Traceback" in str(event.attributes["exception.stacktrace"])

    finished = {
        p.attributes["cyclone.outcome"]: p.value
        for p in telemetry.points("cyclone.step.finished")
        if p.attributes.get("cyclone.workflow") == name
    }
    failed = {
        p.attributes["cyclone.outcome"]: p.value
        for p in telemetry.points("cyclone.step.failed")
        if p.attributes.get("cyclone.workflow") == name
    }
    durations = [
        p
        for p in telemetry.points("cyclone.step.duration")
        if p.attributes.get("cyclone.workflow") == name
    ]
    assert finished == {"retry": 1, "failed": 1}
    assert failed == {"retry": 1, "failed": 1}
    assert sum(p.count for p in durations) == 2
    assert all(p.attributes["cyclone.step"] == "flaky" for p in durations)


def test_completed_attempts_are_counted_as_finished_not_failed(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    wf, _, _ = shop(name)
    wf.submit(engine, {"quantity": 1})
    wf.submit(engine, {"quantity": 3})
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 4
    finished = [
        (p.attributes["cyclone.step"], p.attributes["cyclone.outcome"], p.value)
        for p in telemetry.points("cyclone.step.finished")
        if p.attributes.get("cyclone.workflow") == name
    ]
    assert sorted(finished) == [("charge", "completed", 2), ("reserve", "completed", 2)]
    assert not [
        p
        for p in telemetry.points("cyclone.step.failed")
        if p.attributes.get("cyclone.workflow") == name
    ]


def test_backlog_gauge_reports_waiting_jobs_per_queue_of_a_worker_process(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    @cyclone.step(f"{name}.kind", queue=f"{name}-q")
    def kind(ctx: cyclone.StepContext, args: Any) -> None:
        return None

    for i in range(3):
        kind.enqueue(engine, i)
    kind.enqueue(engine, 99, delay=timedelta(hours=1))  # not due
    worker = cyclone.Worker(engine, steps=[kind])
    backlog = {p.attributes["cyclone.queue"]: p.value for p in telemetry.points("cyclone.backlog")}
    assert backlog[f"{name}-q"] == 3
    assert worker.drain() == 3
    backlog = {p.attributes["cyclone.queue"]: p.value for p in telemetry.points("cyclone.backlog")}
    assert f"{name}-q" not in backlog


def test_the_backlog_gauge_reopens_no_connection_on_the_engine_of_a_worker_done_serving(
    database_url: URL, name: str, telemetry: Telemetry
) -> None:
    # A worker left unclosed once its drain returned (as most are), its engine disposed by
    # its owner: a gauge read through that engine opened a connection in its new pool,
    # open until the engine was garbage-collected (psycopg's "deleted while still open").
    @cyclone.step(f"{name}.kind", queue=f"{name}-q")
    def kind(ctx: cyclone.StepContext, args: Any) -> None:
        return None

    engine = sa.create_engine(database_url)
    try:
        worker = cyclone.Worker(engine, steps=[kind])
        assert worker.drain() == 0
        engine.dispose()
        telemetry.reader.get_metrics_data()  # a collection: the gauge's callback reads
        assert (engine.pool.checkedin(), engine.pool.checkedout()) == (0, 0)
        assert worker.stats.total == 0  # still referenced, not closed
    finally:
        engine.dispose()


def test_a_job_enqueued_in_a_request_runs_in_the_request_trace(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    @cyclone.step(f"{name}.email")
    def email(ctx: cyclone.StepContext, args: Any) -> None:
        return None

    tracer = telemetry.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request, engine.begin() as conn:
        job = email.enqueue_tx(conn, {"to": "a@example.com"}, unique=f"{name}:1")
    assert cyclone.Worker(engine, steps=[email]).drain() == 1

    (submit,) = telemetry.spans("cyclone submit")
    (step,) = telemetry.spans("cyclone step")
    assert submit.attributes is not None
    assert submit.attributes["cyclone.step"] == f"{name}.email"
    assert submit.attributes["cyclone.key"] == f"{name}:1"
    assert submit.attributes["cyclone.job_id"] == str(job.id)
    trace_id = request.get_span_context().trace_id
    assert submit.context is not None
    assert submit.context.trace_id == trace_id
    assert step.context is not None
    assert step.context.trace_id == trace_id
    assert step.parent is not None
    assert step.parent.span_id == submit.context.span_id
    assert step.attributes is not None
    assert step.attributes["cyclone.key"] == f"{name}:1"
    assert step.name == f"cyclone step {name}.email"


def test_a_run_submitted_without_instrumentation_gets_steps_in_a_trace_of_their_own(
    engine: sa.Engine, name: str
) -> None:
    wf, _, _ = shop(name)
    assert _observe.installed() is None
    run = wf.submit(engine, {"quantity": 1})
    assert stored_trace_context(engine, str(run.id)) is None
    with engine.connect() as conn:
        assert (
            conn.execute(
                sa.select(sa.func.count()).where(
                    jobs.c.run_id == run.id, jobs.c.trace_context.is_not(None)
                )
            ).scalar_one()
            == 0
        )

    t = Telemetry()
    otel.instrument(tracer_provider=t.tracer_provider, meter_provider=t.meter_provider)
    try:
        tracer = t.tracer_provider.get_tracer("test")
        with tracer.start_as_current_span("unrelated") as unrelated:
            assert cyclone.Worker(engine, workflows=[wf]).drain() == 2
    finally:
        otel.uninstrument()
    steps = t.spans("cyclone step")
    assert len(steps) == 2
    for span in steps:
        assert span.parent is None
        assert span.context is not None
        assert span.context.trace_id != unrelated.get_span_context().trace_id


def test_uninstrumented_submits_and_steps_make_no_spans(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    otel.uninstrument()
    wf, _, _ = shop(name)
    run, _ = wf.submit_once(engine, "k", {"quantity": 1})
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 2
    assert telemetry.spans() == []
    assert stored_trace_context(engine, str(run.id)) is None


def test_operations_doc_tracing_snippet_runs(engine: sa.Engine, name: str) -> None:
    (snippet,) = docs.blocks("docs/operations.md", "## Tracing and metrics")
    namespace: dict[str, Any] = {}
    exec(compile(snippet, "docs/operations.md", "exec"), namespace)
    tracer_provider, meter_provider = namespace["tracer_provider"], namespace["meter_provider"]
    # The console exporter writes to the stdout of its import; read the spans here too.
    exporter = InMemorySpanExporter()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        wf, _, _ = shop(name)
        wf.submit(engine, {"quantity": 1})
        assert cyclone.Worker(engine, workflows=[wf]).drain() == 2
        assert tracer_provider.force_flush()
        assert meter_provider.force_flush()
    finally:
        otel.uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()
    names = {span.name for span in exporter.get_finished_spans()}
    assert {f"cyclone submit {name}", f"cyclone step {name}.charge"} <= names


def test_the_example_shop_request_its_submit_in_db_session_and_its_steps_are_one_trace(
    database_url: URL, telemetry: Telemetry
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "flask_app"))
    import webshop
    from webshop.models import Stock, db

    app = webshop.create_app(
        {"SQLALCHEMY_DATABASE_URI": database_url.render_as_string(hide_password=False)}
    )
    FlaskInstrumentor().instrument_app(app, tracer_provider=telemetry.tracer_provider)
    item = f"traced-{uuid.uuid4().hex[:8]}"
    with app.app_context():
        db.create_all()
        db.session.add(Stock(item=item, available=5, price_cents=100))
        db.session.commit()
    response = app.test_client().post(
        "/orders", json={"item": item, "quantity": 2}, headers={"Idempotency-Key": item}
    )
    assert response.status_code == 201
    run_id = response.get_json()["run_id"]
    cy = app.extensions["cyclone"]
    with app.app_context():
        engine = db.engine
    with cy.worker(app, workflows=[webshop.checkout]) as worker:
        worker.drain()

    (request,) = telemetry.spans("POST /orders")
    (submit,) = telemetry.spans("cyclone submit webshop.checkout")
    ours = [
        s
        for s in telemetry.spans("cyclone step webshop.checkout")
        if s.attributes is not None and s.attributes["cyclone.run_id"] == run_id
    ]
    assert sorted(s.name for s in ours) == [
        "cyclone step webshop.checkout.confirm",
        "cyclone step webshop.checkout.price",
    ]
    assert request.context is not None
    assert submit.context is not None
    assert submit.parent is not None
    assert submit.parent.span_id == request.context.span_id
    assert submit.attributes is not None
    assert submit.attributes["cyclone.operation"] == "submit_once_tx"
    for span in ours:
        assert span.context is not None
        assert span.context.trace_id == request.context.trace_id
        assert span.parent is not None
        assert span.parent.span_id == submit.context.span_id
    cyclone.close(engine)
    engine.dispose()


def test_a_batch_submit_is_one_span_with_its_counts(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    wf, _, _ = shop(name)
    wf.submit_once(engine, "a", {"quantity": 1})
    wf.submit_once_many(engine, [("a", {"quantity": 1}), ("b", {"quantity": 2})])
    batch = [
        s
        for s in telemetry.spans("cyclone submit")
        if s.attributes is not None and s.attributes["cyclone.operation"] == "submit_once_many"
    ]
    assert len(batch) == 1
    assert batch[0].attributes is not None
    assert batch[0].attributes["cyclone.count"] == 2
    assert batch[0].attributes["cyclone.created_count"] == 1


def test_every_signal_sent_is_a_span_naming_the_signal_its_run_and_whether_it_was_accepted(
    engine: sa.Engine, name: str, telemetry: Telemetry
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def reserve(ctx: cyclone.StepContext, order: Any) -> int:
        return 1

    @wf.wait("paid", after=[reserve])
    def paid(ctx: cyclone.StepContext, payment: Any) -> Any:
        return payment

    by_key, _ = wf.submit_once(engine, "a", {"quantity": 1})
    by_run, _ = wf.submit_once(engine, "b", {"quantity": 1})
    in_tx, _ = wf.submit_once(engine, "c", {"quantity": 1})
    assert wf.signal(engine, "a", "paid", {"ref": 1}) is True
    assert wf.signal(engine, "a", "paid", {"ref": 1}) is False  # the same payload again
    assert by_run.signal("paid", {"ref": 2}) is True
    with engine.begin() as conn:
        assert wf.signal_tx(conn, "c", "paid", {"ref": 3}) is True
    with pytest.raises(cyclone.errors.SubmitConflictError):
        wf.signal(engine, "a", "paid", {"ref": 4})  # another payload

    sent = telemetry.spans("cyclone signal")
    assert [s.name for s in sent] == [f"cyclone signal {name}.paid"] * 5
    seen = [
        (
            dict(s.attributes or {}).get("cyclone.run_id"),
            dict(s.attributes or {}).get("cyclone.signal.accepted"),
            s.status.status_code,
        )
        for s in sent
    ]
    a, b, c = str(by_key.id), str(by_run.id), str(in_tx.id)
    assert seen == [
        (a, True, StatusCode.UNSET),
        (a, False, StatusCode.UNSET),
        (b, True, StatusCode.UNSET),
        (c, True, StatusCode.UNSET),
        (a, False, StatusCode.ERROR),
    ]
    for span in sent:
        assert span.kind == SpanKind.PRODUCER
        assert span.attributes is not None
        assert span.attributes["cyclone.workflow"] == name
    assert dict(sent[0].attributes or {})["cyclone.key"] == "a"
    assert "cyclone.key" not in dict(sent[2].attributes or {})
