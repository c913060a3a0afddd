"""Forking a run onto the code that fixes it (``run.fork``), through the public API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from werkzeug.test import Client as WebClient

import cyclone
from cyclone.dashboard import create_app
from cyclone.schema import jobs, runs
from tests.conftest import StatementCounter, wait_until
from tests.support import docs, fork_app, fork_proc, processes
from tests.support.dashboard import text_of
from tests.support.fork_defs import Order, three_steps
from tests.support.workers import blocked_by

REPO = Path(__file__).resolve().parent.parent


def drain(engine: sa.Engine, wf: cyclone.Workflow[Any]) -> None:
    with cyclone.Worker(engine, workflows=[wf]) as worker:
        worker.drain()


def steps_of(engine: sa.Engine, run_id: uuid.UUID) -> dict[str, tuple[str, Any]]:
    detail = cyclone.Client(engine).get_run_detail(run_id)
    assert detail is not None
    return {s.name: (s.state.value, s.output) for s in detail.steps}


def test_a_fork_onto_the_fixed_definition_keeps_completed_steps_and_runs_the_rest(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    buggy = three_steps(name, calls, fixed=False)
    run, _ = buggy.submit_once(engine, "order:1", Order(1, 500))
    drain(engine, buggy)
    assert run.status().state == cyclone.RunState.FAILED
    assert calls == {"charge": 1, "label": 1}

    fixed = three_steps(name, calls, fixed=True)  # the deploy: same name, label corrected
    fork, created = fixed.run(engine, run.id).fork("order:1:fixed", rerun=[fixed.steps["label"]])
    assert created
    assert fork.status().forked_from == run.id
    drain(engine, fixed)

    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert calls == {"charge": 1, "label": 2, "notify": 1}
    assert steps_of(engine, fork.id) == {
        "charge": ("completed", "receipt-1"),
        "label": ("completed", "label for receipt-1"),
        "notify": ("completed", "sent label for receipt-1"),
    }


def failed_run(engine: sa.Engine, name: str, calls: Counter[str]) -> cyclone.Run:
    buggy = three_steps(name, calls, fixed=False)
    run, _ = buggy.submit_once(engine, "order:7", Order(7, 700))
    drain(engine, buggy)
    assert run.status().state == cyclone.RunState.FAILED
    return run


def runs_of(engine: sa.Engine, name: str) -> list[cyclone.RunStatus]:
    return cyclone.Client(engine).list_runs(workflow=name, limit=100)


def test_forking_twice_with_the_same_key_returns_the_first_fork(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    fixed = three_steps(name, calls, fixed=True)
    first, created = fixed.run(engine, run.id).fork("fixed")
    again, created_again = fixed.run(engine, run.id).fork("fixed", rerun=["label"])
    assert (created, created_again) == (True, False)
    assert again == first
    assert len(runs_of(engine, name)) == 2


def test_a_fork_key_held_by_a_run_with_another_input_is_a_conflict(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    fixed = three_steps(name, calls, fixed=True)
    other, _ = fixed.submit_once(engine, "taken", Order(8, 1))
    with pytest.raises(cyclone.SubmitConflictError) as raised:
        fixed.run(engine, run.id).fork("taken")
    assert raised.value.run_id == other.id
    # A run of the key with the same input is the fork's answer, as for submit_once.
    same, _ = fixed.submit_once(engine, "same", Order(7, 700))
    assert fixed.run(engine, run.id).fork("same") == (same, False)


def test_a_failed_step_runs_again_on_the_new_code_without_being_named(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    fixed = three_steps(name, calls, fixed=True)
    fork, _ = fixed.run(engine, run.id).fork("fixed")
    drain(engine, fixed)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert calls == {"charge": 1, "label": 2, "notify": 1}


def test_rerun_runs_the_named_step_and_everything_downstream_of_it(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    wf = three_steps(name, calls, fixed=True)
    run, _ = wf.submit_once(engine, "done", Order(3, 3))
    drain(engine, wf)
    assert run.status().state == cyclone.RunState.COMPLETED
    fork, _ = wf.run(engine, run.id).fork("again", rerun=["charge"])
    drain(engine, wf)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert calls == {"charge": 2, "label": 2, "notify": 2}
    middle, _ = wf.run(engine, run.id).fork("middle", rerun=["label"])
    drain(engine, wf)
    assert middle.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert calls == {"charge": 2, "label": 3, "notify": 3}


def test_a_fork_with_nothing_to_run_is_born_completed_with_the_outputs(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    wf = cyclone.ResultWorkflow(name, input=Order, output=str)

    @wf.step()
    def charge(ctx: cyclone.StepContext, order: Order) -> str:
        calls["charge"] += 1
        return "receipt"

    @wf.result(after=[charge])
    def total(ctx: cyclone.StepContext, order: Order) -> str:
        return f"{ctx.output(charge)}: {order.cents}"

    run, _ = wf.submit_once(engine, "paid", Order(1, 42))
    drain(engine, wf)
    assert run.result(timeout=10) == "receipt: 42"
    copy, created = wf.run(engine, run.id).fork("copy")
    assert created
    assert copy.status().state == cyclone.RunState.COMPLETED
    assert copy.result(timeout=10) == "receipt: 42"
    assert calls == {"charge": 1}


def test_a_kept_step_the_definition_no_longer_has_is_refused_and_nothing_is_written(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    redeployed = cyclone.Workflow(name, input=Order)  # charge is gone

    @redeployed.step()
    def label(ctx: cyclone.StepContext, order: Order) -> str:
        return "label"

    with pytest.raises(cyclone.DefinitionError, match=r"'charge'.*no longer defines it"):
        redeployed.run(engine, run.id).fork("fixed")
    assert [r.id for r in runs_of(engine, name)] == [run.id]
    # Named in rerun=, the removed step's output is dropped and the fork is made.
    fork, created = redeployed.run(engine, run.id).fork("fixed", rerun=["charge"])
    assert created
    drain(engine, redeployed)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED


def test_a_kept_step_whose_upstreams_changed_is_refused_and_nothing_is_written(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    redeployed = cyclone.Workflow(name, input=Order)

    @redeployed.step()
    def check(ctx: cyclone.StepContext, order: Order) -> None:
        return None

    @redeployed.step(after=[check])  # charge now comes after a new step
    def charge(ctx: cyclone.StepContext, order: Order) -> str:
        return "receipt"

    with pytest.raises(cyclone.DefinitionError, match=r"'charge'.*upstream steps changed"):
        redeployed.run(engine, run.id).fork("fixed")
    assert [r.id for r in runs_of(engine, name)] == [run.id]


def test_a_rerun_naming_no_step_is_refused_and_nothing_is_written(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    fixed = three_steps(name, calls, fixed=True)
    with pytest.raises(cyclone.DefinitionError, match="'lable'"):
        fixed.run(engine, run.id).fork("fixed", rerun=["lable"])
    assert [r.id for r in runs_of(engine, name)] == [run.id]


@pytest.mark.parametrize(
    ("rerun", "message"),
    [
        ("label", r"a list of steps or step names, such as \['label'\]"),
        ([5], "not int"),
        ([None], "not NoneType"),
    ],
)
def test_a_rerun_that_is_a_str_or_holds_no_step_is_a_type_error_and_nothing_is_written(
    engine: sa.Engine, name: str, rerun: Any, message: str, statements: StatementCounter
) -> None:
    # A str was taken for the names of its letters ("rerun= names 'l'", or single-letter
    # steps re-run that nobody named); an int or None was an AttributeError.
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    handle = three_steps(name, calls, fixed=True).run(engine, run.id)
    statements.reset()
    with pytest.raises(TypeError, match=message):
        handle.fork("fixed", rerun=rerun)
    assert statements.statements == []
    assert [r.id for r in runs_of(engine, name)] == [run.id]


def test_a_running_run_cannot_be_forked(engine: sa.Engine, name: str) -> None:
    calls: Counter[str] = Counter()
    wf = three_steps(name, calls, fixed=True)
    run, _ = wf.submit_once(engine, "running", Order(1, 1))
    with pytest.raises(cyclone.InvalidStateError, match="cannot fork run"):
        wf.run(engine, run.id).fork("fixed")
    with pytest.raises(cyclone.InvalidKeyError):
        wf.run(engine, run.id).fork("")
    assert [r.id for r in runs_of(engine, name)] == [run.id]


def test_a_fork_reads_its_sources_steps_as_they_are_once_it_holds_the_source(
    engine: sa.Engine, name: str
) -> None:
    # The statement that locks the source sees the steps as they were when it began: a
    # retry, a claim and a cancel committed while it waited for the lock left a step
    # running, which the fork must see, or the step runs in both runs.
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    fixed = three_steps(name, calls, fixed=True)
    label = (jobs.c.run_id == run.id) & (jobs.c.kind == "label")
    outcome: list[object] = []

    def fork() -> None:
        try:
            outcome.append(fixed.run(engine, run.id).fork("fixed"))
        except cyclone.CycloneError as exc:
            outcome.append(exc)

    with engine.connect() as holder:
        tx = holder.begin()
        holder.execute(sa.select(runs.c.id).where(runs.c.id == run.id).with_for_update())
        pid = holder.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()
        forking = threading.Thread(target=fork)
        forking.start()
        wait_until(lambda: blocked_by(engine, pid) is not None, 30)
        # What the retry, the claim of `label` and the cancel leave behind.
        holder.execute(sa.update(runs).where(runs.c.id == run.id).values(state="cancelled"))
        holder.execute(
            sa.update(jobs)
            .where(label)
            .values(
                state="running",
                finalized_at=None,
                attempt=1,  # reset by the retry, claimed once since
                lease=jobs.c.lease + 1,
                worker_id="elsewhere",
                heartbeat_at=sa.func.now(),
            )
        )
        tx.commit()
        forking.join(30)
    (refused,) = outcome
    assert isinstance(refused, cyclone.InvalidStateError), refused
    assert "steps still running" in str(refused)
    assert len(runs_of(engine, name)) == 1
    with engine.begin() as conn:  # its worker hands it back into the ended run
        conn.execute(
            sa.update(jobs)
            .where(label)
            .values(
                state="cancelled", finalized_at=sa.func.now(), worker_id=None, heartbeat_at=None
            )
        )


def test_a_fork_of_a_run_of_another_workflow_or_of_no_run_is_not_found(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    other = three_steps(f"{name}-other", calls, fixed=True)
    with pytest.raises(cyclone.NotFoundError):
        other._handle_of(engine, run.id, None).fork("fixed")
    gone = three_steps(name, calls, fixed=True)._handle_of(engine, uuid.uuid4(), None)
    with pytest.raises(cyclone.NotFoundError):
        gone.fork("fixed")


def fork_waits_for_the_source(engine: sa.Engine) -> bool:
    """Whether the forking subprocess's session waits for a lock, in its first statement
    (it has written nothing: it has no transaction id). That statement begins with the
    CTE that locks the source's limit key (``pg_stat_activity`` keeps a query's first
    1024 bytes, which no longer reach its ``FOR SHARE``)."""
    with engine.connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = :app AND wait_event_type = 'Lock' "
                "AND query LIKE 'WITH locked_keys %' AND backend_xid IS NULL"
            ),
            {"app": fork_proc.APPLICATION_NAME},
        ).scalar_one()
    return bool(found)


def test_a_process_killed_while_forking_leaves_no_fork_and_the_key_forks_again(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    env = {**os.environ}
    assert "CYCLONE_TEST_DATABASE_URL" in env
    with engine.connect() as holder:
        # The test holds the source run's row: the fork's transaction has begun and waits
        # at its first statement until the process is killed.
        holder.execute(
            sa.text("SELECT 1 FROM cyclone_runs WHERE id = :id FOR UPDATE"), {"id": run.id}
        )
        child = processes.popen(
            [sys.executable, "-m", "tests.support.fork_proc", name, str(run.id), "fixed"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(lambda: child.poll() is not None or fork_waits_for_the_source(engine), 60)
            assert child.poll() is None, child.communicate()[1]
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        finally:
            holder.rollback()
    assert child.returncode == -signal.SIGKILL
    # The server ends the dead client's session; nothing of the fork was written.
    assert [r.id for r in runs_of(engine, name)] == [run.id]
    fixed = three_steps(name, calls, fixed=True)
    fork, created = fixed.run(engine, run.id).fork("fixed", rerun=["label"])
    assert created
    drain(engine, fixed)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert calls == {"charge": 1, "label": 2, "notify": 1}


def test_a_fork_in_a_subprocess_makes_the_fork(engine: sa.Engine, name: str) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    done = processes.run(
        [sys.executable, "-m", "tests.support.fork_proc", name, str(run.id), "fixed"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    made = json.loads(done.stdout)
    assert made["created"] is True
    status = cyclone.Client(engine).get_run(made["run_id"])
    assert status is not None
    assert status.forked_from == run.id


def test_a_database_error_while_writing_the_steps_leaves_no_fork(
    own_engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(own_engine, name, calls)
    with own_engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE FUNCTION refuse_notify() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'injected: no notify step'; END $$"
            )
        )
        conn.execute(
            sa.text(
                "CREATE TRIGGER refuse_notify BEFORE INSERT ON cyclone_jobs FOR EACH ROW "
                "WHEN (NEW.kind = 'notify') EXECUTE FUNCTION refuse_notify()"
            )
        )
    fixed = three_steps(name, calls, fixed=True)
    with pytest.raises(sa.exc.DBAPIError, match="injected"):
        fixed.run(own_engine, run.id).fork("fixed")
    # The run row was inserted by the same statement, before the steps: rolled back too.
    assert [r.id for r in runs_of(own_engine, name)] == [run.id]
    with own_engine.begin() as conn:
        conn.execute(sa.text("DROP TRIGGER refuse_notify ON cyclone_jobs"))
    fork, created = fixed.run(own_engine, run.id).fork("fixed")
    assert created
    drain(own_engine, fixed)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED


def cyclone_cli(database_url: sa.URL, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CYCLONE_DATABASE_URL": database_url.render_as_string(False)}
    return processes.run(
        [sys.executable, "-m", "cyclone", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_forks_a_run_shows_where_it_came_from_and_refuses_in_one_line(
    engine: sa.Engine, database_url: sa.URL
) -> None:
    calls: Counter[str] = Counter()
    buggy = three_steps(fork_app.WORKFLOW, calls, fixed=False)
    run, _ = buggy.submit_once(engine, f"order:{uuid.uuid4()}", Order(9, 900))
    drain(engine, buggy)
    key = f"fixed:{uuid.uuid4()}"
    app = ["--app", "tests.support.fork_app"]

    forked = cyclone_cli(
        database_url, "runs", "fork", str(run.id), "--key", key, "--rerun", "label", *app
    )
    assert forked.returncode == 0, forked.stderr
    fork = fork_app.fixed.get_run(engine, key)
    assert fork is not None
    assert (
        forked.stdout == f"forked run {run.id} of workflow {fork_app.WORKFLOW} as run {fork.id}\n"
    )
    again = cyclone_cli(database_url, "runs", "fork", str(run.id), "--key", key, *app)
    assert again.stdout.startswith(f"already forked run {run.id}"), again.stderr

    shown = cyclone_cli(database_url, "runs", "show", str(fork.id))
    assert shown.returncode == 0, shown.stderr
    assert f"forked from  {run.id}" in shown.stdout
    as_json = cyclone_cli(database_url, "runs", "show", str(fork.id), "--json")
    assert json.loads(as_json.stdout)["forked_from"] == str(run.id)

    wrong = cyclone_cli(
        database_url, "runs", "fork", str(run.id), "--key", "k2", "--rerun", "lable", *app
    )
    assert wrong.returncode == 1
    assert wrong.stderr.count("\n") == 1, wrong.stderr
    assert "'lable'" in wrong.stderr
    bare = cyclone_cli(database_url, "runs", "fork", str(run.id), "--key", "k3")
    assert bare.returncode == 2, bare.stderr
    assert "--app" in bare.stderr
    assert fork_app.fixed.get_run(engine, "k2") is None
    assert fork_app.fixed.get_run(engine, "k3") is None


def test_the_dashboard_run_page_shows_forked_from_with_a_link_to_the_source(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    fixed = three_steps(name, calls, fixed=True)
    fork, _ = fixed.run(engine, run.id).fork("fixed")
    web = WebClient(create_app(engine))
    page = web.get(f"/runs/{fork.id}").get_data(as_text=True)
    assert f'forked from</dt><dd><a href="/runs/{run.id}">' in page
    assert "forked from" in text_of(page)
    assert "forked from" not in text_of(web.get(f"/runs/{run.id}").get_data(as_text=True))


def test_the_fork_page_blocks_run_in_order(
    database_url: sa.URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CYCLONE_DATABASE_URL", database_url.render_as_string(False))
    namespace: dict[str, Any] = {"__name__": "docs_fork"}
    blocks = docs.all_blocks("docs/fork.md")
    assert len(blocks) == docs.fenced_blocks("docs/fork.md")
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/fork.md block {i + 1}", "exec"), namespace)
    finally:
        engine = namespace.get("engine")
        if isinstance(engine, sa.Engine):
            engine.dispose()


def test_a_fork_costs_two_statements_and_a_second_fork_of_the_key_too(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    calls: Counter[str] = Counter()
    run = failed_run(engine, name, calls)
    handle = three_steps(name, calls, fixed=True).run(engine, run.id)
    statements.reset()
    handle.fork("fixed", rerun=["label"])
    made = list(statements.statements)
    statements.reset()
    handle.fork("fixed")
    again = list(statements.statements)
    for sent in (made, again):
        sql = [s for s in sent if s.split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK")]
        assert len(sql) == 3, sent
        assert "FOR SHARE" in sql[0]
        assert "jsonb_object_agg" in sql[1]  # the steps' states, read under the lock
        assert sql[2].lstrip().upper().startswith("WITH"), sql[2]
