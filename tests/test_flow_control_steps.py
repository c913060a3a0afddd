"""Limits on workflow steps: ``@wf.step(concurrency=|rate=)`` bounds a step's running
attempts (or attempt starts) per key, the key evaluated on the run's input at submit.

The multi-process tests sample the running attempts per key from the database while
several worker processes (tests/support/flow_proc.py) serve; the others run a worker in
this process.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone.schema import jobs
from tests.conftest import wait_until
from tests.support.factories import starts_per_second
from tests.support.flow_proc import step_workflows
from tests.test_flow_control import spawn, stop

RUNNING = (
    "SELECT limit_key, count(*) FROM cyclone_jobs WHERE state = 'running' "
    "AND limit_name = :n GROUP BY limit_key"
)


def running(engine: sa.Engine, limit: str) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(dict(conn.execute(sa.text(RUNNING), {"n": limit}).all()))


def runs_left(engine: sa.Engine, prefix: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM cyclone_runs WHERE workflow LIKE :p "
                    "AND state <> 'completed'"
                ),
                {"p": prefix + "%"},
            ).scalar_one()
        )


def sample_until_done(
    engine: sa.Engine, prefix: str, limit: str, timeout: float = 90.0
) -> Counter[str]:
    """The most seen running at once per key, sampled until every run completed."""
    most: Counter[str] = Counter()

    def done() -> bool:
        for key, n in running(engine, limit).items():
            most[key] = max(most[key], n)
        return runs_left(engine, prefix) == 0

    wait_until(done, timeout=timeout, interval=0.005)
    return most


def test_a_steps_running_attempts_per_key_never_exceed_max_across_worker_processes(
    engine: sa.Engine, name: str
) -> None:
    spec = {"limit": "steps", "max": 2, "concurrency": 4}
    (wf,) = step_workflows(name, spec)
    for k in "abc":
        for _ in range(12):
            wf.submit(engine, {"k": k, "ms": 20})
    procs = [spawn(name, spec) for _ in range(3)]
    try:
        most = sample_until_done(engine, name, f"step:{name}.limited")
    finally:
        stop(procs)
    assert set(most) == {"a", "b", "c"}
    assert max(most.values()) == 2, most


def test_a_shared_named_limit_bounds_the_steps_of_two_workflows_together(
    engine: sa.Engine, name: str
) -> None:
    shared = f"{name}-shared"
    spec = {"limit": "steps", "max": 1, "concurrency": 4, "name": shared, "workflows": 2}
    workflows = step_workflows(name, spec)
    for wf in workflows:
        for k in "ab":
            for _ in range(8):
                wf.submit(engine, {"k": k, "ms": 15})
    procs = [spawn(name, spec) for _ in range(2)]
    try:
        most = sample_until_done(engine, name, shared)
    finally:
        stop(procs)
    assert most == Counter({"a": 1, "b": 1}), most
    with engine.connect() as conn:
        kinds = conn.execute(
            sa.text("SELECT DISTINCT workflow FROM cyclone_jobs WHERE limit_name = :n"),
            {"n": shared},
        ).scalars()
        assert set(kinds) == {wf.name for wf in workflows}


def test_a_killed_workers_step_slot_comes_back_when_its_job_is_rescued(
    engine: sa.Engine, name: str, tmp_path: Path
) -> None:
    spec = {"limit": "steps", "max": 1, "concurrency": 4}
    (wf,) = step_workflows(name, spec)
    flag = tmp_path / "blocked"
    wf.submit(engine, {"k": "x", "ms": 0, "block": str(flag)})
    first = spawn(name, spec)
    wait_until(flag.exists, timeout=30)
    for _ in range(5):
        wf.submit(engine, {"k": "x", "ms": 10})
    other = spawn(name, spec)
    try:
        # While the killed worker's step holds the only slot, no other step of "x" starts.
        first.kill()
        first.communicate(timeout=10)
        most = sample_until_done(engine, name, f"step:{name}.limited")
    finally:
        stop([first, other])
    assert most["x"] == 1
    with engine.connect() as conn:
        lost = conn.execute(
            sa.text(
                "SELECT j.lost FROM cyclone_jobs j JOIN cyclone_runs r ON r.id = j.run_id "
                "WHERE r.workflow = :w AND j.kind = 'limited' AND r.input ? 'block'"
            ),
            {"w": name},
        ).scalar_one()
    assert lost == 1


def test_a_killed_workers_run_slot_of_a_workflow_limit_holds_until_its_run_ends(
    engine: sa.Engine, name: str, tmp_path: Path
) -> None:
    from tests.support.flow_proc import workflow
    from tests.test_flow_control_workflows import in_progress, states

    spec = {"limit": "workflow", "max": 1, "concurrency": 4}
    wf = workflow(name, spec)
    flag = tmp_path / "blocked"
    wf.submit(engine, {"k": "x", "ms": 0, "block": str(flag)})
    first = spawn(name, spec)
    wait_until(flag.exists, timeout=30)
    for _ in range(4):
        wf.submit(engine, {"k": "x", "ms": 10})
    other = spawn(name, spec)
    most = 0
    try:
        first.kill()
        first.communicate(timeout=10)

        def done() -> bool:
            nonlocal most
            most = max(most, in_progress(engine, name)["x"])
            return states(engine, name) == Counter({"completed": 5})

        wait_until(done, timeout=90, interval=0.005)
    finally:
        stop([first, other])
    assert most == 1


def blocking_steps(
    name: str, key: Any = lambda v: v["k"]
) -> tuple[cyclone.Workflow[Any], threading.Event]:
    """A workflow whose step ``gate`` (limited to 1 per ``key(input)``) blocks until the
    event is set."""
    release = threading.Event()
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(concurrency=cyclone.Concurrency(1, key=key))
    def gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> str:
        assert release.wait(30)
        return str(value["n"])

    @wf.step(after=[gate])
    def then(ctx: cyclone.StepContext, value: dict[str, Any]) -> str:
        return ctx.output(gate)

    return wf, release


def job_of(engine: sa.Engine, run: Any, kind: str) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            sa.text(
                "SELECT state, limit_name, limit_key, attempt FROM cyclone_jobs "
                "WHERE run_id = :r AND kind = :k"
            ),
            {"r": run.id, "k": kind},
        ).one()
    return dict(row._mapping)


def state_of(engine: sa.Engine, run: Any, kind: str) -> str | None:
    """The state of ``run``'s step ``kind``; None before the run started."""
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT state FROM cyclone_jobs WHERE run_id = :r AND kind = :k"),
            {"r": run.id, "k": kind},
        ).scalar_one_or_none()


def test_a_worker_serving_one_workflow_of_a_shared_step_limit_never_claims_anothers_step(
    engine: sa.Engine, name: str
) -> None:
    # Two workflows' steps share one limit's name and are served by different workers.
    # The limited claim chose steps by limit name alone: the worker of the first took the
    # second's waiting step when its own freed the slot, and failed it as not defined.
    shared = cyclone.Concurrency(1, name=f"{name}-shared")
    release = threading.Event()
    mine: cyclone.Workflow[Any] = cyclone.Workflow(name)
    other: cyclone.Workflow[Any] = cyclone.Workflow(f"{name}.other")

    @mine.step(concurrency=shared, name="gate")
    def mine_gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        assert release.wait(30)

    @other.step(concurrency=shared, name="gate")
    def other_gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        return None

    ours = mine.submit(engine, {})
    first = cyclone.Worker(engine, workflows=[mine], sweep=False)
    draining = threading.Thread(target=first.drain)
    draining.start()
    try:
        wait_until(lambda: state_of(engine, ours, "gate") == "running")
        theirs = other.submit(engine, {})
        with cyclone.Worker(engine, workflows=[other], sweep=False) as second:
            second.drain()  # starts the run; its step waits for the slot ours holds
        assert state_of(engine, theirs, "gate") == "available"
    finally:
        release.set()
        draining.join(30)
    first.close()
    assert ours.status().state == "completed"
    assert job_of(engine, theirs, "gate")["state"] == "available"
    assert job_of(engine, theirs, "gate")["attempt"] == 0
    with cyclone.Worker(engine, workflows=[other], sweep=False) as second:
        second.drain()
    assert theirs.status().state == "completed"


def redeployed(name: str, limit: cyclone.Concurrency | None) -> cyclone.Workflow[Any]:
    """A definition of workflow ``name`` whose step ``gate`` has ``limit``: a deploy's."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(concurrency=limit)
    def gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        return None

    @wf.step(after=[gate])
    def then(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        return None

    return wf


@pytest.mark.parametrize("limit", [None, "renamed"])
def test_steps_submitted_before_a_redeploy_changed_their_limit_run_under_the_one_they_kept(
    engine: sa.Engine, name: str, limit: str | None
) -> None:
    # A run keeps its steps' limits; a deploy that dropped or renamed one left its steps
    # waiting, available, for a worker serving a name no definition had any more.
    before = redeployed(name, cyclone.Concurrency(1))
    runs = [before.submit(engine, {}) for _ in range(3)]
    after = redeployed(name, None if limit is None else cyclone.Concurrency(1, name=limit))
    with cyclone.Worker(engine, workflows=[after], sweep=False) as worker:
        worker.drain()
    assert [run.status().state for run in runs] == ["completed"] * 3
    assert {job_of(engine, run, "gate")["limit_name"] for run in runs} == {f"step:{name}.gate"}
    with engine.connect() as conn:
        spans = conn.execute(
            sa.text(
                "SELECT attempted_at, finalized_at FROM cyclone_jobs "
                "WHERE kind = 'gate' AND run_id = ANY(:ids) ORDER BY attempted_at"
            ),
            {"ids": [run.id for run in runs]},
        ).all()
    # Under the limit they kept, Concurrency(1): one at a time.
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), spans


def test_a_serving_worker_takes_on_an_earlier_limit_once_steps_under_it_wait(
    engine: sa.Engine, name: str, serving: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runs are submitted under the old limit after the worker started: its look at
    # the start found nothing, so the steps wait for its next look while it serves.
    monkeypatch.setattr("cyclone.worker.ADOPT_INTERVAL", 0.05)
    after = redeployed(name, None)
    serving(cyclone.Worker(engine, workflows=[after], poll_interval=0.05, sweep=False))
    before = redeployed(name, cyclone.Concurrency(1))
    runs = [before.submit(engine, {}) for _ in range(3)]
    for run in runs:
        wait_until(lambda run=run: run.status().state == "completed", timeout=20)
    assert {job_of(engine, run, "gate")["limit_name"] for run in runs} == {f"step:{name}.gate"}


def test_a_steps_key_is_evaluated_at_submit_and_kept_with_the_run(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, _ = blocking_steps(name)
    run = wf.submit(engine, {"k": "before", "n": 1})
    # A redeploy with another key function does not move the run submitted before it.
    again, release = blocking_steps(name, key=lambda v: "after")
    release.set()
    serving(cyclone.Worker(engine, workflows=[again], concurrency=2, poll_interval=30))
    wait_until(lambda: run.status().state == "completed", timeout=20)
    job = job_of(engine, run, "gate")
    assert (job["limit_name"], job["limit_key"]) == (f"step:{name}.gate", "before")
    assert job_of(engine, run, "then")["limit_name"] is None


def test_a_limited_step_waits_holding_no_worker_and_starts_when_a_slot_frees(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_steps(name)
    first = wf.submit(engine, {"k": "a", "n": 1})
    second = wf.submit(engine, {"k": "a", "n": 2})
    other = wf.submit(engine, {"k": "b", "n": 3})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=30))
    wait_until(lambda: running(engine, f"step:{name}.gate") == Counter({"a": 1, "b": 1}))
    wait_until(lambda: None not in {state_of(engine, run, "gate") for run in (first, second)})
    assert {state_of(engine, run, "gate") for run in (first, second)} == {
        "running",
        "available",
    }
    (limit,) = [s for s in cyclone.Client(engine).list_limits() if s.name == f"step:{name}.gate"]
    assert (limit.counts, limit.max) == ("attempts", 1)
    assert dict(limit.keys)["a"] == (1, 1)
    release.set()
    for run in (first, second, other):
        wait_until(lambda run=run: run.status().state == "completed", timeout=20)
    assert [run.status().state for run in (first, second, other)] == ["completed"] * 3


def test_a_retried_step_takes_a_slot_again_and_a_cancelled_run_frees_its_slot(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    release = threading.Event()
    tries: Counter[int] = Counter()
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(concurrency=cyclone.Concurrency(1, key=lambda v: v["k"]), max_attempts=3)
    def gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        tries[value["n"]] += 1
        if value["n"] == 1 and tries[1] == 1:
            raise RuntimeError("first try fails")
        if value["n"] == 2:
            assert release.wait(30)

    retried = wf.submit(engine, {"k": "a", "n": 1})
    serving(
        cyclone.Worker(
            engine,
            workflows=[wf],
            concurrency=4,
            poll_interval=0.2,
            backoff=lambda attempt: 0.0,
        )
    )
    wait_until(lambda: retried.status().state == "completed", timeout=20)
    assert tries[1] == 2
    blocked = wf.submit(engine, {"k": "a", "n": 2})
    wait_until(lambda: state_of(engine, blocked, "gate") == "running")
    waiting = wf.submit(engine, {"k": "a", "n": 3})
    wait_until(lambda: state_of(engine, waiting, "gate") == "available")
    assert running(engine, f"step:{name}.gate") == Counter({"a": 1})
    assert state_of(engine, blocked, "gate") == "running"
    blocked.cancel()
    release.set()
    wait_until(lambda: waiting.status().state == "completed", timeout=20)
    assert blocked.status().state == "cancelled"


def test_a_step_limit_refuses_other_strategies_and_bad_values_at_definition(name: str) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    for bad in ("cancel_newest", "cancel_in_progress"):
        with pytest.raises(cyclone.DefinitionError, match="on_limit"):
            wf.step(concurrency=cyclone.Concurrency(1, on_limit=bad))  # type: ignore[arg-type]
    with pytest.raises(cyclone.DefinitionError, match="concurrency= takes"):
        wf.step(concurrency=3)  # type: ignore[arg-type]
    with pytest.raises(cyclone.DefinitionError, match="rate= takes"):
        wf.step(rate=cyclone.Concurrency(1))  # type: ignore[arg-type]
    assert not wf.steps


def test_a_steps_limit_key_that_raises_refuses_the_submit_writing_nothing(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(rate=cyclone.Rate(5, timedelta(seconds=1), key=lambda v: v["missing"]))
    def only(ctx: cyclone.StepContext, value: dict[str, Any]) -> None: ...

    with pytest.raises(cyclone.InputError, match="key of limit"):
        wf.submit(engine, {"k": "a"})
    with pytest.raises(cyclone.InputError, match="key of limit"):
        wf.submit_once_many(engine, [("one", {"k": "a"})])
    with engine.connect() as conn:
        count = conn.execute(
            sa.text("SELECT count(*) FROM cyclone_runs WHERE workflow = :w"), {"w": name}
        ).scalar_one()
    assert count == 0


def test_a_rate_on_a_step_starts_at_most_limit_attempts_per_window(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(rate=cyclone.Rate(3, timedelta(seconds=1)))
    def call(ctx: cyclone.StepContext, value: int) -> int:
        return value

    runs = [run for run, _ in wf.submit_once_many(engine, [(f"r{i}", i) for i in range(8)])]
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    for run in runs:
        wait_until(lambda run=run: run.status().state == "completed", timeout=30)
    windows = starts_per_second(engine, jobs.c.workflow == name)
    assert all(n <= 3 for _, n in windows), windows
    assert len(windows) >= 3, windows


def test_retry_all_runs_a_limited_step_again_within_its_limit(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    failing = threading.Event()
    failing.set()
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(concurrency=cyclone.Concurrency(1, key=lambda v: v["k"]), max_attempts=1)
    def gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        if failing.is_set():
            raise RuntimeError("down")
        threading.Event().wait(0.02)

    runs = [wf.submit(engine, {"k": "a", "n": n}) for n in range(4)]
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    for run in runs:
        wait_until(lambda run=run: run.status().state == "failed", timeout=20)
    failing.clear()
    for run in runs:
        run.retry_all()
    most: Counter[str] = Counter()

    def done() -> bool:
        for key, n in running(engine, f"step:{name}.gate").items():
            most[key] = max(most[key], n)
        return all(run.status().state == "completed" for run in runs)

    wait_until(done, timeout=30, interval=0.005)
    # Never two at once (a sampler slowed by load may see none running: not the rule).
    assert set(most) <= {"a"}, most
    assert max(most.values(), default=0) <= 1, most
    assert {job_of(engine, run, "gate")["limit_key"] for run in runs} == {"a"}


def test_a_delayed_run_holds_no_slot_of_its_workflows_or_steps_limit_until_due(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        name, concurrency=cyclone.Concurrency(1, key=lambda v: v["k"])
    )

    @wf.step(concurrency=cyclone.Concurrency(1, key=lambda v: v["k"]))
    def gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> int:
        return int(value["n"])

    later = wf.submit(engine, {"k": "a", "n": 1}, delay=timedelta(hours=1))
    at = wf.submit(engine, {"k": "a", "n": 2}, run_at=datetime.now(UTC) + timedelta(hours=1))
    now = wf.submit(engine, {"k": "a", "n": 3})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    wait_until(lambda: now.status().state == "completed", timeout=20)
    assert [run.status().state for run in (later, at)] == ["running", "running"]
    assert state_of(engine, later, "gate") is None  # not started: no step, no slot
    limits = {s.name: s for s in cyclone.Client(engine).list_limits()}
    assert dict(limits[f"workflow:{name}"].keys)["a"] == (0, 2)
    assert dict(limits[f"step:{name}.gate"].keys).get("a", (0, 0)) == (0, 0)


def test_a_run_parked_at_a_wait_or_a_sleep_holds_no_step_slot(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(concurrency=cyclone.Concurrency(1))
    def gate(ctx: cyclone.StepContext, value: int) -> int:
        return value

    @wf.wait("approve", after=[gate])
    def approved(ctx: cyclone.StepContext, payload: int) -> int:
        return payload

    @wf.sleep(timedelta(hours=1), after=[gate])
    def nap(ctx: cyclone.StepContext, value: int) -> None: ...

    first = wf.submit(engine, 1)
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=0.2))
    wait_until(lambda: state_of(engine, first, "gate") == "completed", timeout=20)
    second = wf.submit(engine, 2)
    # The first run is parked at its wait and its sleep: the second's gate still runs.
    wait_until(lambda: state_of(engine, second, "gate") == "completed", timeout=20)
    assert first.status().state == "running"
    assert running(engine, f"step:{name}.gate") == Counter()
    first.cancel()
    second.cancel()


def test_submit_once_duplicates_of_a_step_limited_workflow_take_no_second_slot(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_steps(name)
    one, created = wf.submit_once(engine, "order:1", {"k": "a", "n": 1})
    (two, again), (three, _) = wf.submit_once_many(
        engine, [("order:1", {"k": "a", "n": 1}), ("order:2", {"k": "a", "n": 2})]
    )
    assert (created, again, one.id == two.id) == (True, False, True)
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    wait_until(
        lambda: {state_of(engine, run, "gate") for run in (one, three)} == {"running", "available"},
        timeout=20,
    )
    assert running(engine, f"step:{name}.gate") == Counter({"a": 1})
    release.set()
    for run in (one, three):
        wait_until(lambda run=run: run.status().state == "completed", timeout=20)
    with engine.connect() as conn:
        gates = conn.execute(
            sa.text("SELECT count(*) FROM cyclone_jobs WHERE workflow = :w AND kind = 'gate'"),
            {"w": name},
        ).scalar_one()
    assert gates == 2


def test_a_forked_runs_limited_steps_keep_the_source_runs_limits_and_keys(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    wf, release = blocking_steps(name)
    release.set()
    source = wf.submit(engine, {"k": "a", "n": 1})
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=0.2))
    wait_until(lambda: source.status().state == "completed", timeout=20)
    forked, created = source.fork("fork:1", rerun=["gate"])
    assert created
    wait_until(lambda: forked.status().state == "completed", timeout=20)
    job = job_of(engine, forked, "gate")
    assert (job["limit_name"], job["limit_key"], job["attempt"]) == (f"step:{name}.gate", "a", 1)


def test_a_step_given_a_concurrency_and_a_rate_keeps_both_keys_and_lists_both(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    release = threading.Event()
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(
        concurrency=cyclone.Concurrency(1, key=lambda v: v["k"]),
        rate=cyclone.Rate(100, timedelta(days=1), key=lambda v: f"r-{v['k']}"),
    )
    def gate(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        assert release.wait(30)

    runs = [wf.submit(engine, {"k": "a", "n": n}) for n in range(2)]
    serving(cyclone.Worker(engine, workflows=[wf], concurrency=4, poll_interval=0.2))
    wait_until(
        lambda: {state_of(engine, run, "gate") for run in runs} == {"running", "available"},
        timeout=20,
    )
    limits = {s.name: s for s in cyclone.Client(engine).list_limits()}
    assert dict(limits[f"step:{name}.gate"].keys) == {"a": (1, 1)}
    assert dict(limits[f"step:{name}.gate.rate"].keys) == {"r-a": (1, 1)}
    assert limits[f"step:{name}.gate.rate"].counts == "starts"
    release.set()
    for run in runs:
        wait_until(lambda run=run: run.status().state == "completed", timeout=20)
    with engine.connect() as conn:
        counted, started = conn.execute(
            sa.text(
                "SELECT k.window_count, (SELECT count(*) FROM cyclone_jobs j "
                "WHERE j.workflow = :w AND j.attempted_at >= k.window_start) "
                "FROM cyclone_limit_keys k WHERE k.name = :n AND k.key = 'r-a'"
            ),
            {"n": f"step:{name}.gate.rate", "w": name},
        ).one()
    assert counted == started >= 1
