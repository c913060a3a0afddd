"""Standalone jobs: ``@cyclone.step`` kinds, ``enqueue``/``enqueue_tx`` and unique keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import cyclone
from cyclone.schema import jobs
from tests.conftest import StatementCounter
from tests.support.workers import rescue_lost_jobs


class Email(msgspec.Struct):
    to: str
    subject: str


def email_kind(kind: str, *, max_attempts: int = 3) -> cyclone.StandaloneStep[Email, str]:
    @cyclone.step(kind, max_attempts=max_attempts)
    def send(ctx: cyclone.StepContext, args: Email) -> str:
        return f"sent {args.subject} to {args.to}"

    return send


def failing_kind(kind: str) -> cyclone.StandaloneStep[Email, None]:
    @cyclone.step(kind, max_attempts=1)
    def send(ctx: cyclone.StepContext, args: Email) -> None:
        raise RuntimeError("smtp down")

    return send


def job_count(engine: sa.Engine, kind: str) -> int:
    with engine.connect() as c:
        return int(c.execute(sa.select(sa.func.count()).where(jobs.c.kind == kind)).scalar_one())


def test_enqueue_returns_a_job_handle_that_runs_to_its_typed_result(
    engine: sa.Engine, name: str
) -> None:
    send = email_kind(name)
    job = send.enqueue(engine, Email("a@example.com", "hi"), unique="welcome:1")
    assert isinstance(job, cyclone.Job)
    assert isinstance(job.id, int)
    assert (job.kind, job.key) == (name, "welcome:1")
    status = job.status()
    assert status.state == cyclone.JobState.AVAILABLE
    assert (status.kind, status.key, status.queue, status.max_attempts) == (
        name,
        "welcome:1",
        "default",
        3,
    )

    assert cyclone.Worker(engine, steps=[send]).drain() == 1
    assert job.wait(timeout=10).state == cyclone.JobState.COMPLETED
    assert job.result(timeout=10) == "sent hi to a@example.com"


def test_enqueue_options_are_stored_on_the_job(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    run_at = datetime.now(UTC) + timedelta(hours=1)
    job = send.enqueue(
        engine, Email("a", "b"), run_at=run_at, queue=f"{name}-q", priority=7, max_attempts=9
    )
    status = job.status()
    assert status.scheduled_at == run_at
    assert (status.queue, status.priority, status.max_attempts) == (f"{name}-q", 7, 9)
    assert status.key is None


def test_enqueue_delay_schedules_the_job_after_now(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    job = send.enqueue(engine, Email("a", "b"), delay=timedelta(hours=2))
    status = job.status()
    assert status.scheduled_at - status.created_at >= timedelta(hours=2)


def test_a_failed_job_result_raises_run_failed_error(engine: sa.Engine, name: str) -> None:
    send = failing_kind(name)
    job = send.enqueue(engine, Email("a", "b"))
    cyclone.Worker(engine, steps=[send]).drain()
    with pytest.raises(cyclone.RunFailedError) as err:
        job.result(timeout=10)
    assert err.value.state == "failed"
    assert job.status().errors[-1]["message"] == "smtp down"


def test_enqueue_tx_joins_the_callers_connection_transaction(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    with engine.connect() as c:
        tx = c.begin()
        job = send.enqueue_tx(c, Email("a", "b"), unique="k")
        assert job_count(engine, name) == 0  # not visible before the commit
        tx.rollback()
    assert job_count(engine, name) == 0
    with pytest.raises(cyclone.NotFoundError):
        job.status()

    with engine.begin() as c:
        job = send.enqueue_tx(c, Email("a", "b"), unique="k")
    assert job.status().state == cyclone.JobState.AVAILABLE


def test_enqueue_tx_joins_a_session_transaction(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    with Session(engine) as session:
        send.enqueue_tx(session, Email("a", "b"))
        session.rollback()
    assert job_count(engine, name) == 0
    with Session(engine) as session:
        job = send.enqueue_tx(session, Email("a", "b"))
        session.commit()
    assert job.status().state == cyclone.JobState.AVAILABLE


def test_a_rolled_back_enqueue_tx_frees_its_unique_key(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    with engine.connect() as c, c.begin() as tx:
        send.enqueue_tx(c, Email("a", "b"), unique="k")
        tx.rollback()
    assert send.enqueue(engine, Email("a", "b"), unique="k").key == "k"


def test_a_second_enqueue_of_an_active_unique_key_raises_duplicate_error(
    engine: sa.Engine, name: str
) -> None:
    send = email_kind(name)
    first = send.enqueue(engine, Email("a", "b"), unique="welcome:42")
    with pytest.raises(cyclone.DuplicateError) as err:
        send.enqueue(engine, Email("other", "args"), unique="welcome:42")
    assert isinstance(err.value, cyclone.CycloneError)
    assert (err.value.job_id, err.value.kind, err.value.key) == (first.id, name, "welcome:42")
    assert job_count(engine, name) == 1


def test_a_running_job_still_holds_its_unique_key(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    first = send.enqueue(engine, Email("a", "b"), unique="k")
    with engine.begin() as c:
        c.execute(
            sa.update(jobs)
            .where(jobs.c.id == first.id)
            .values(
                state="running",
                attempt=1,
                worker_id="elsewhere",
                attempted_at=sa.func.now(),
                heartbeat_at=sa.func.now(),
            )
        )
    with pytest.raises(cyclone.DuplicateError) as err:
        send.enqueue(engine, Email("a", "b"), unique="k")
    assert err.value.job_id == first.id
    rescue_lost_jobs(engine)  # "elsewhere" never was: its job goes back to available


def test_two_kinds_can_share_a_unique_key(engine: sa.Engine, name: str) -> None:
    one = email_kind(f"{name}-one")
    two = email_kind(f"{name}-two")
    a = one.enqueue(engine, Email("a", "b"), unique="shared")
    b = two.enqueue(engine, Email("a", "b"), unique="shared")
    assert a.id != b.id


def test_jobs_without_a_unique_key_never_collide(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    ids = {send.enqueue(engine, Email("a", "b")).id for _ in range(3)}
    assert len(ids) == 3


def test_a_unique_key_is_free_again_once_its_job_completed(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    first = send.enqueue(engine, Email("a", "b"), unique="k")
    assert cyclone.Worker(engine, steps=[send]).drain() == 1
    assert first.status().state == cyclone.JobState.COMPLETED
    second = send.enqueue(engine, Email("a", "b"), unique="k")
    assert second.id != first.id
    assert second.status().state == cyclone.JobState.AVAILABLE


def test_a_unique_key_is_free_again_once_its_job_failed_for_good(
    engine: sa.Engine, name: str
) -> None:
    send = failing_kind(name)
    first = send.enqueue(engine, Email("a", "b"), unique="k")
    assert cyclone.Worker(engine, steps=[send]).drain() == 1
    assert first.status().state == cyclone.JobState.FAILED
    second = send.enqueue(engine, Email("a", "b"), unique="k")
    assert second.id != first.id


def test_a_duplicate_inside_enqueue_tx_does_not_abort_the_callers_transaction(
    engine: sa.Engine, name: str
) -> None:
    send = email_kind(name)
    holder = send.enqueue(engine, Email("a", "b"), unique="k")
    with engine.begin() as c:
        with pytest.raises(cyclone.DuplicateError) as err:
            send.enqueue_tx(c, Email("a", "b"), unique="k")
        assert err.value.job_id == holder.id
        assert c.execute(sa.select(sa.literal(1))).scalar_one() == 1  # still usable
        other = send.enqueue_tx(c, Email("a", "b"), unique="other")
    assert other.status().state == cyclone.JobState.AVAILABLE


def test_a_second_enqueue_tx_of_a_key_in_the_same_transaction_is_a_duplicate(
    engine: sa.Engine, name: str
) -> None:
    send = email_kind(name)
    with engine.begin() as c:
        first = send.enqueue_tx(c, Email("a", "b"), unique="k")
        with pytest.raises(cyclone.DuplicateError) as err:
            send.enqueue_tx(c, Email("a", "b"), unique="k")
        assert err.value.job_id == first.id
    assert job_count(engine, name) == 1


@pytest.mark.parametrize(
    "key",
    ["", "a\x00b", "x" * 257, "é" * 129, "\ud800", 42, b"bytes"],
    ids=["empty", "nul", "257-bytes", "258-utf8-bytes", "lone-surrogate", "int", "bytes"],
)
def test_bad_unique_keys_raise_invalid_key_error_before_any_statement(
    engine: sa.Engine, name: str, statements: StatementCounter, key: object
) -> None:
    send = email_kind(name)
    with engine.connect() as c:
        statements.reset()
        with pytest.raises(cyclone.InvalidKeyError) as err:
            send.enqueue_tx(c, Email("a", "b"), unique=key)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="invalid key"):  # a ValueError too
            send.enqueue(engine, Email("a", "b"), unique=key)  # type: ignore[arg-type]
        assert statements.count == 0
    assert err.value.key == key
    assert job_count(engine, name) == 0


def test_a_unique_key_of_256_utf8_bytes_is_accepted(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    assert send.enqueue(engine, Email("a", "b"), unique="é" * 128).key == "é" * 128


def test_args_not_matching_the_annotated_type_raise_input_error_before_the_database(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    send = email_kind(name)
    statements.reset()
    with pytest.raises(cyclone.InputError):
        send.enqueue(engine, {"to": "a"}, unique="k")  # missing field
    with pytest.raises(cyclone.InputError):
        send.enqueue(engine, 42)
    with engine.connect() as c, pytest.raises(cyclone.InputError):
        send.enqueue_tx(c, {"to": 1, "subject": "s"})
    assert statements.count == 0
    assert job_count(engine, name) == 0


def test_unique_enqueues_keep_working_once_the_driver_prepares_the_statement(
    engine: sa.Engine, name: str
) -> None:
    # psycopg prepares a statement after its 5th execution on a connection; the
    # ON CONFLICT predicate must still match the partial unique index then.
    send = email_kind(name)
    with engine.begin() as c:
        ids = [send.enqueue_tx(c, Email("a", "b"), unique=f"k{i}").id for i in range(12)]
        with pytest.raises(cyclone.DuplicateError) as err:
            send.enqueue_tx(c, Email("a", "b"), unique="k7")
    assert err.value.job_id == ids[7]
    assert job_count(engine, name) == 12


def test_enqueue_takes_a_client_as_its_bind(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    job = send.enqueue(cyclone.Client(engine), Email("a", "b"), unique="k")
    assert job.status().key == "k"
    with pytest.raises(cyclone.DuplicateError):
        send.enqueue(cyclone.Client(engine), Email("a", "b"), unique="k")
