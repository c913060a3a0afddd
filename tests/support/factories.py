"""Workflow factories and row readers shared by the submit tests (no tests here)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import msgspec
import sqlalchemy as sa

import cyclone
from cyclone._store import unstarted as _unstarted
from cyclone.schema import jobs, runs


class Order(msgspec.Struct):
    id: int
    amount: int


def workflow(name: str, steps: int = 1, *, input: Any = Any) -> cyclone.Workflow[Any]:
    """A workflow named ``name``: a chain of ``steps`` steps."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name, input=input)
    previous: list[str] = []
    for i in range(steps):
        wf.step(f"s{i}", after=previous)(noop)
        previous = [f"s{i}"]
    return wf


def result_workflow(name: str, *, input: Any = Any) -> cyclone.ResultWorkflow[Any, Any]:
    """A ResultWorkflow named ``name`` whose one step is its result node."""
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name, input=input, output=Any)
    wf.result("total")(noop)
    return wf


def noop(ctx: cyclone.StepContext, value: Any) -> None:
    return None


def count_runs(bind: sa.Engine | sa.Connection, workflow: str, key: str | None = None) -> int:
    stmt = sa.select(sa.func.count()).where(runs.c.workflow == workflow)
    if key is not None:
        stmt = stmt.where(runs.c.submit_key == key)
    if isinstance(bind, sa.Engine):
        with bind.connect() as conn:
            return int(conn.execute(stmt).scalar_one())
    return int(bind.execute(stmt).scalar_one())


def count_jobs(engine: sa.Engine, workflow: str) -> int:
    """The workflow's steps: created ones, and those of its runs not started yet."""
    pending = _unstarted.pending_steps().subquery("pending")
    with engine.connect() as conn:
        created = sa.select(sa.func.count()).where(jobs.c.workflow == workflow)
        to_create = sa.select(sa.func.count()).where(pending.c.workflow == workflow)
        return int(conn.execute(created).scalar_one() + conn.execute(to_create).scalar_one())


def starts_per_second(engine: sa.Engine, *where: Any) -> list[tuple[float, int]]:
    """Attempts started in each second (a one-second Rate's windows) by the jobs ``where``
    selects, in time order."""
    second = sa.func.floor(sa.extract("epoch", jobs.c.attempted_at))
    stmt = sa.select(second, sa.func.count()).where(*where).group_by(second).order_by(second)
    with engine.connect() as conn:
        return [(float(at), int(n)) for at, n in conn.execute(stmt)]


def run_ids(engine: sa.Engine, workflow: str) -> set[uuid.UUID]:
    with engine.connect() as conn:
        return set(conn.execute(sa.select(runs.c.id).where(runs.c.workflow == workflow)).scalars())


def job_kinds(engine: sa.Engine, run_id: uuid.UUID) -> list[str]:
    """The run's steps by name, as its detail shows them (created or not yet), sorted."""
    detail = cyclone.Client(engine).get_run_detail(run_id)
    return [] if detail is None else sorted(step.name for step in detail.steps)


def finish(
    engine: sa.Engine, run_id: uuid.UUID, state: cyclone.RunState, ago: timedelta = timedelta(0)
) -> None:
    """Mark a run terminal by hand, as if it had ended ``ago``, its steps as cyclone would
    have left them: all completed in a completed run, none left to run in another."""
    ended = sa.func.now() - ago
    with engine.begin() as conn:
        conn.execute(
            runs.update()
            .where(runs.c.id == run_id)
            .values(
                state=state.value,
                finalized_at=ended,
                steps_remaining=0
                if state is cyclone.RunState.COMPLETED
                else runs.c.steps_remaining,
            )
        )
        conn.execute(
            jobs.update()
            .where(jobs.c.run_id == run_id, jobs.c.finalized_at.is_(None))
            .values(
                state="completed" if state is cyclone.RunState.COMPLETED else "cancelled",
                finalized_at=ended,
            )
        )
