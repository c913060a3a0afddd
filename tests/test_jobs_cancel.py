"""``Job.cancel()``: a standalone job that has not started never runs; others are refused."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import cyclone
from tests.test_jobs import Email, email_kind


def test_cancel_of_an_available_job_keeps_it_from_running(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    job = send.enqueue(engine, Email("a@example.com", "hi"), unique="k")
    job.cancel()
    status = job.status()
    assert status.state == cyclone.JobState.CANCELLED
    assert status.finished_at is not None
    assert cyclone.Worker(engine, steps=[send]).drain() == 0
    assert job.status().state == cyclone.JobState.CANCELLED
    send.enqueue(engine, Email("a@example.com", "hi"), unique="k")  # the key is free again


def test_cancel_of_a_finished_job_raises_invalid_state_naming_the_job(
    engine: sa.Engine, name: str
) -> None:
    send = email_kind(name)
    job = send.enqueue(engine, Email("a@example.com", "hi"))
    cyclone.Worker(engine, steps=[send]).drain()
    with pytest.raises(
        cyclone.InvalidStateError, match=f"cannot cancel job {job.id}: it is completed"
    ):
        job.cancel()
    assert job.status().state == cyclone.JobState.COMPLETED


def test_cancel_of_a_missing_job_raises_not_found(engine: sa.Engine, name: str) -> None:
    send = email_kind(name)
    job = send.enqueue(engine, Email("a@example.com", "hi"))
    with engine.begin() as c:
        c.execute(sa.text("DELETE FROM cyclone_jobs WHERE id = :id"), {"id": job.id})
    with pytest.raises(cyclone.NotFoundError):
        job.cancel()
