"""Parked work is visible: a run waiting for a signal, sleeping, or delayed keeps the state
``running`` but says why it waits (``RunStatus.parked``), its steps say what they wait for
(``StepStatus.waiting_for``, ``wakes_at``, ``parked``), and listings and counts tell parked
runs from running ones."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import cyclone
from cyclone import Parked, RunState
from cyclone.client import StepStatus
from tests.conftest import wait_until


@dataclass
class Parking:
    """Three workflows whose runs park: waiting for 'paid', sleeping an hour, delayed a day."""

    waits: cyclone.Workflow[int]
    sleeps: cyclone.Workflow[int]
    busy: cyclone.Workflow[int]

    @property
    def all(self) -> list[cyclone.Workflow[int]]:
        return [self.waits, self.sleeps, self.busy]


def parking(name: str) -> Parking:
    waits: cyclone.Workflow[int] = cyclone.Workflow(f"{name}_waits", input=int)

    @waits.step()
    def reserve(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @waits.wait("paid", after=[reserve])
    def paid(ctx: cyclone.StepContext, amount: int) -> int:
        return amount

    sleeps: cyclone.Workflow[int] = cyclone.Workflow(f"{name}_sleeps", input=int)

    @sleeps.step()
    def signup(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @sleeps.sleep(timedelta(hours=1), after=[signup])
    def remind(ctx: cyclone.StepContext, n: int) -> int:
        return n

    # A wait node beside a step that is due: the run is running, its wait node waits.
    busy: cyclone.Workflow[int] = cyclone.Workflow(f"{name}_busy", input=int)

    @busy.wait("go")
    def go(ctx: cyclone.StepContext, payload: int) -> int:
        return payload

    @busy.step(queue="other")
    def work(ctx: cyclone.StepContext, n: int) -> int:
        return n

    return Parking(waits, sleeps, busy)


def step(detail: cyclone.client.RunDetail | None, name: str) -> StepStatus:
    assert detail is not None
    return next(s for s in detail.steps if s.name == name)


def test_a_run_waiting_for_a_signal_says_so_and_its_node_names_the_signal(
    engine: sa.Engine, name: str
) -> None:
    flows = parking(name)
    run = flows.waits.submit(engine, 1)
    cyclone.Worker(engine, workflows=[flows.waits]).drain()
    status = run.status()
    assert status.state == RunState.RUNNING
    assert status.parked == Parked.WAITING
    detail = cyclone.Client(engine).get_run_detail(run.id)
    node = step(detail, "paid")
    assert (node.waiting_for, node.parked, node.wakes_at) == ("paid", Parked.WAITING, None)
    assert step(detail, "reserve").parked is None
    run.signal("paid", 5)
    assert run.status().parked is None  # the signal arrived: due, not waiting
    assert step(cyclone.Client(engine).get_run_detail(run.id), "paid").waiting_for is None
    cyclone.Worker(engine, workflows=[flows.waits]).drain()
    assert run.wait(timeout=10).state == RunState.COMPLETED
    assert run.status().parked is None


def test_a_wait_node_with_a_timeout_wakes_at_its_timeout(engine: sa.Engine, name: str) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.wait("approved", timeout=timedelta(hours=2))
    def approved(ctx: cyclone.StepContext, ok: bool) -> bool:
        return ok

    run = wf.submit(engine, 1)
    before = datetime.now(UTC)
    cyclone.Worker(engine, workflows=[wf]).drain()
    node = step(cyclone.Client(engine).get_run_detail(run.id), "approved")
    assert node.waiting_for == "approved"
    assert node.parked == Parked.WAITING
    assert node.wakes_at is not None
    assert before + timedelta(hours=2) - timedelta(minutes=1) < node.wakes_at
    assert run.status().parked == Parked.WAITING


def test_a_sleeping_run_says_so_and_its_node_wakes_at_its_time(
    engine: sa.Engine, name: str
) -> None:
    flows = parking(name)
    run = flows.sleeps.submit(engine, 2)
    cyclone.Worker(engine, workflows=[flows.sleeps]).drain()
    assert run.status().parked == Parked.SLEEPING
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    assert detail.status.parked == Parked.SLEEPING
    node = step(detail, "remind")
    assert node.state == cyclone.JobState.AVAILABLE
    assert node.parked == Parked.SLEEPING
    assert node.waiting_for is None
    signup_done = step(detail, "signup").finished_at
    assert signup_done is not None
    assert node.wakes_at == signup_done + timedelta(hours=1)
    assert node.wakes_at > detail.read_at  # "ready since" a time ahead is what it replaces


def test_a_delayed_run_says_so_and_its_first_step_starts_at_its_time(
    engine: sa.Engine, name: str
) -> None:
    flows = parking(name)
    at = datetime.now(UTC) + timedelta(days=1)
    run = flows.waits.submit(engine, 3, run_at=at)
    assert run.status().parked == Parked.DELAYED
    detail = cyclone.Client(engine).get_run_detail(run.id)
    reserve = step(detail, "reserve")
    assert (reserve.parked, reserve.wakes_at) == (Parked.DELAYED, at)
    assert (step(detail, "paid").parked, step(detail, "paid").wakes_at) == (None, None)
    run.cancel()
    assert run.status().parked is None


def test_a_run_with_a_step_due_beside_a_waiting_node_is_running(
    engine: sa.Engine, name: str
) -> None:
    flows = parking(name)
    run = flows.busy.submit(engine, 4)
    # A worker of the default queue only: the wait node parks, "work" (queue "other") stays due.
    cyclone.Worker(engine, workflows=[flows.busy], queues={"default": 1}).drain()
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert step(detail, "go").waiting_for == "go"
    assert step(detail, "work").state == cyclone.JobState.AVAILABLE
    assert run.status().parked is None
    assert run.id not in {r.id for r in cyclone.Client(engine).list_runs(parked="waiting")}
    cyclone.Worker(engine, workflows=[flows.busy]).drain()
    assert run.status().parked == Parked.WAITING
    run.cancel()


def test_a_retry_in_backoff_wakes_at_its_retry_and_is_not_sleeping(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step(max_attempts=3)
    def flaky(ctx: cyclone.StepContext, n: int) -> int:
        raise RuntimeError("not yet")

    run = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], backoff=lambda attempt: 3600.0)
    worker.drain()
    node = step(cyclone.Client(engine).get_run_detail(run.id), "flaky")
    assert node.attempt == 1
    assert node.wakes_at is not None
    assert node.parked is None
    assert run.status().parked is None
    run.cancel()


def test_listings_filter_by_parked_and_counts_tell_parked_from_running(
    engine: sa.Engine, name: str
) -> None:
    flows = parking(name)
    waiting = flows.waits.submit(engine, 1)
    sleeping = flows.sleeps.submit(engine, 2)
    delayed = flows.waits.submit(engine, 3, delay=timedelta(days=1))
    due = flows.sleeps.submit(engine, 4)  # due, never started: running
    cyclone.Worker(engine, workflows=[flows.waits, flows.sleeps]).drain()
    due_again = flows.sleeps.submit(engine, 5)
    client = cyclone.Client(engine)
    of = {flows.waits.name, flows.sleeps.name}

    def ids(**filters: object) -> set[object]:
        return {r.id for r in client.list_runs(limit=1000, **filters) if r.workflow in of}  # type: ignore[arg-type]

    assert ids(parked="waiting") == {waiting.id}
    assert ids(parked=Parked.SLEEPING) == {sleeping.id, due.id}
    assert ids(parked="delayed") == {delayed.id}
    assert ids(parked="sleeping", workflow=flows.waits.name) == set()
    page = client.page_runs(parked="waiting", workflow=flows.waits.name)
    assert [r.id for r in page.runs] == [waiting.id]
    assert page.runs[0].parked == Parked.WAITING
    # A page whose other filters no index serves (a state) reads parked too.
    page = client.page_runs(workflow=flows.sleeps.name, state="running")
    assert {r.id: r.parked for r in page.runs} == {
        due_again.id: None,
        due.id: Parked.SLEEPING,
        sleeping.id: Parked.SLEEPING,
    }
    listed = {r.id: r.parked for r in client.list_runs(workflow=flows.sleeps.name)}
    assert listed[due_again.id] is None
    counts = client.count_parked_runs(workflow=flows.waits.name)
    assert counts == {Parked.WAITING: 1, Parked.SLEEPING: 0, Parked.DELAYED: 1}
    assert client.count_parked_runs(workflow=flows.sleeps.name)[Parked.SLEEPING] == 2
    assert set(client.count_parked_runs()) == set(Parked)
    with pytest.raises(ValueError, match="'resting'"):
        client.list_runs(parked="resting")
    for run in (waiting, sleeping, delayed, due, due_again):
        run.cancel()
    assert ids(parked="waiting") == set()


def test_a_waiting_run_leaves_the_waiting_listing_and_completes_once_signalled(
    engine: sa.Engine, name: str
) -> None:
    flows = parking(name)
    run = flows.waits.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[flows.waits])
    worker.drain()
    wait_until(lambda: run.status().parked == Parked.WAITING)
    client = cyclone.Client(engine)
    assert run.id in {r.id for r in client.list_runs(parked="waiting", limit=1000)}
    run.signal("paid", 1)
    assert run.id not in {r.id for r in client.list_runs(parked="waiting", limit=1000)}
    worker.drain()
    assert run.wait(timeout=10).state == RunState.COMPLETED
