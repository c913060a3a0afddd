"""submit_once, submit_once_tx, submit and submit_tx: one rule per test."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import cyclone
from cyclone._store import claim as _claim
from cyclone._store import executor as _executor
from cyclone._store import submission as submit_module
from cyclone.schema import definitions, jobs, runs
from tests.conftest import StatementCounter
from tests.support.factories import (
    Order,
    count_jobs,
    count_runs,
    finish,
    job_kinds,
    noop,
    result_workflow,
    run_ids,
    workflow,
)
from tests.support.workers import rescue_lost_jobs


def stored_graph(engine: sa.Engine, run_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(definitions.c.graph)
            .join_from(runs, definitions, definitions.c.id == runs.c.definition)
            .where(runs.c.id == run_id)
        ).scalar_one()


def test_created_is_true_then_false_with_the_same_run_id(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    first, created = wf.submit_once(engine, "order:1", {"n": 1})
    assert created is True
    second, created_again = wf.submit_once(engine, "order:1", {"n": 1})
    assert created_again is False
    assert second.id == first.id
    assert second == first
    assert (first.workflow, first.key) == (second.workflow, second.key) == (name, "order:1")
    assert count_runs(engine, name) == 1
    assert job_kinds(engine, first.id) == ["s0"]


def test_the_handle_reads_the_run_of_the_key(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    _, _ = wf.submit_once(engine, "k", 1)
    status = run.status()
    assert status.id == run.id
    assert (status.workflow, status.key, status.state) == (name, "k", cyclone.RunState.RUNNING)
    assert isinstance(run.id, uuid.UUID)
    assert uuid.UUID(str(run.id)) == run.id


def test_a_key_is_scoped_per_workflow_name(engine: sa.Engine, name: str) -> None:
    one = workflow(name + "_one")
    two = workflow(name + "_two")
    run_one, created_one = one.submit_once(engine, "shared", 1)
    run_two, created_two = two.submit_once(engine, "shared", 2)  # a different input is fine
    assert created_one
    assert created_two
    assert run_one.id != run_two.id
    assert (run_one.workflow, run_two.workflow) == (name + "_one", name + "_two")


@pytest.mark.parametrize(
    "state", [cyclone.RunState.COMPLETED, cyclone.RunState.FAILED, cyclone.RunState.CANCELLED]
)
def test_a_key_is_held_in_every_state(
    engine: sa.Engine, name: str, state: cyclone.RunState
) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    finish(engine, run.id, state)
    assert run.status().state == state
    again, created = wf.submit_once(engine, "k", 1)
    assert created is False
    assert again.id == run.id
    assert count_runs(engine, name) == 1


def test_a_key_is_held_after_cancel(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    run.cancel()
    assert run.status().state == cyclone.RunState.CANCELLED
    again, created = wf.submit_once(engine, "k", 1)
    assert (again.id, created) == (run.id, False)


def test_key_order_and_whitespace_do_not_matter(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", {"a": 1, "b": {"x": [1, 2], "y": None}})
    again, created = wf.submit_once(engine, "k", {"b": {"y": None, "x": [1, 2]}, "a": 1})
    assert (again.id, created) == (run.id, False)
    # Below the encoder: the database compares the JSON text as jsonb.
    raw = '{  "b" : {"y":null,\n "x" : [1,  2]},\t"a":1 }'
    row = submit_module.submit_once(engine, wf.plan(), "k", raw, submit_module.Timing())
    assert (row.run_id, row.created) == (run.id, False)
    with pytest.raises(cyclone.SubmitConflictError):
        submit_module.submit_once(
            engine, wf.plan(), "k", '{"a":1,"b":{"x":[2,1],"y":null}}', submit_module.Timing()
        )


def test_a_struct_and_an_equal_dict_are_the_same_input(engine: sa.Engine, name: str) -> None:
    wf = workflow(name, input=Order)
    run, _ = wf.submit_once(engine, "k", Order(id=7, amount=100))
    again, created = wf.submit_once(engine, "k", {"amount": 100, "id": 7})
    assert (again.id, created) == (run.id, False)


def test_one_and_one_point_zero_are_the_same_input(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", {"amount": 1})
    again, created = wf.submit_once(engine, "k", {"amount": 1.0})
    assert (again.id, created) == (run.id, False)


@pytest.mark.parametrize(
    "other",
    [
        pytest.param({"n": 2}, id="value"),
        pytest.param({"n": 1, "extra": None}, id="extra-field"),
        pytest.param({"n": "1"}, id="type"),
        pytest.param([{"n": 1}], id="shape"),
    ],
)
def test_a_different_input_raises_submit_conflict_and_inserts_nothing(
    engine: sa.Engine, name: str, other: Any
) -> None:
    wf = workflow(name, 3)
    run, _ = wf.submit_once(engine, "order:9", {"n": 1})
    runs_before, jobs_before = count_runs(engine, name), count_jobs(engine, name)
    with pytest.raises(cyclone.SubmitConflictError) as info:
        wf.submit_once(engine, "order:9", other)
    error = info.value
    assert (error.run_id, error.workflow, error.key) == (run.id, name, "order:9")
    assert str(run.id) in str(error)
    assert name in str(error)
    assert "order:9" in str(error)
    assert isinstance(error, cyclone.CycloneError)
    assert (count_runs(engine, name), count_jobs(engine, name)) == (runs_before, jobs_before)
    with engine.begin() as conn, pytest.raises(cyclone.SubmitConflictError):
        wf.submit_once_tx(conn, "order:9", other)
    assert (count_runs(engine, name), count_jobs(engine, name)) == (runs_before, jobs_before)


def test_rollback_frees_the_key(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    with engine.connect() as conn, conn.begin() as tx:
        rolled_back, created = wf.submit_once_tx(conn, "k", 1)
        assert created
        assert count_runs(conn, name, "k") == 1
        tx.rollback()
    assert count_runs(engine, name) == 0
    with pytest.raises(cyclone.NotFoundError):
        rolled_back.status()
    run, created = wf.submit_once(engine, "k", 1)
    assert created is True
    assert run.id != rolled_back.id


def test_a_second_call_in_the_same_transaction_returns_the_first_run(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    with engine.begin() as conn:
        first, created = wf.submit_once_tx(conn, "k", {"a": 1})
        second, created_again = wf.submit_once_tx(conn, "k", {"a": 1})
        assert (created, created_again) == (True, False)
        assert second.id == first.id
    assert count_runs(engine, name) == 1


def test_a_conflict_does_not_abort_the_callers_transaction(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    with engine.begin() as conn:
        first, _ = wf.submit_once_tx(conn, "k", 1)
        with pytest.raises(cyclone.SubmitConflictError):
            wf.submit_once_tx(conn, "k", 2)
        assert conn.execute(sa.select(sa.literal(1))).scalar_one() == 1
        other, created = wf.submit_once_tx(conn, "k2", 2)
        assert created
    assert run_ids(engine, name) == {first.id, other.id}


def test_options_do_not_take_part_and_the_run_keeps_its_first_options(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    deadline = datetime(2100, 1, 2, 3, 4, 5, tzinfo=UTC)
    run, _ = wf.submit_once(engine, "k", 1, deadline=deadline, retention=timedelta(days=1))
    again, created = wf.submit_once(
        engine, "k", 1, deadline=timedelta(minutes=5), retention=timedelta(days=30)
    )
    assert (again.id, created) == (run.id, False)
    plain, created = wf.submit_once(engine, "k", 1)
    assert (plain.id, created) == (run.id, False)
    status = run.status()
    assert status.deadline == deadline
    assert status.retention == timedelta(days=1)


def test_a_deadline_as_timedelta_is_counted_from_now(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    before = datetime.now(UTC)
    run, _ = wf.submit_once(engine, "k", 1, deadline=timedelta(hours=1))
    deadline = run.status().deadline
    assert deadline is not None
    assert timedelta(minutes=59) < deadline - before < timedelta(minutes=61)
    assert run.status().retention is None


def test_a_changed_graph_still_returns_the_old_run(engine: sa.Engine, name: str) -> None:
    old = workflow(name, 2)
    run, _ = old.submit_once(engine, "k", 1)
    old_graph = stored_graph(engine, run.id)

    new: cyclone.Workflow[Any] = cyclone.Workflow(name)  # a redeploy: same name, new steps

    @new.step()
    def fetch(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    @new.step(after=[fetch], max_attempts=9)
    def store(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    @new.step(after=[store])
    def notify(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    again, created = new.submit_once(engine, "k", 1)
    assert (again.id, created) == (run.id, False)
    assert stored_graph(engine, run.id) == old_graph
    assert [step["name"] for step in old_graph["steps"]] == ["s0", "s1"]
    assert job_kinds(engine, run.id) == ["s0", "s1"]
    fresh, created = new.submit_once(engine, "k2", 1)
    assert created
    assert job_kinds(engine, fresh.id) == ["fetch", "notify", "store"]


def test_workflow_and_result_workflow_of_the_same_name_share_keys(
    engine: sa.Engine, name: str
) -> None:
    plain = workflow(name)
    typed = result_workflow(name)
    run, created = plain.submit_once(engine, "k", 1)
    assert created
    typed_run, created = typed.submit_once(engine, "k", 1)
    assert created is False
    assert typed_run.id == run.id
    assert isinstance(typed_run, cyclone.ResultRun)
    with pytest.raises(cyclone.NoOutputError) as info:
        typed_run.result(timeout=5)
    assert info.value.run_id == run.id


def test_a_result_workflow_first_keeps_its_result_node_for_the_plain_handle(
    engine: sa.Engine, name: str
) -> None:
    typed = result_workflow(name)
    plain = workflow(name)
    typed_run, _ = typed.submit_once(engine, "k", 1)
    run, created = plain.submit_once(engine, "k", 1)
    assert (run.id, created) == (typed_run.id, False)
    assert type(run) is cyclone.Run
    with engine.connect() as conn:
        result_step = conn.execute(
            sa.select(runs.c.result_step).where(runs.c.id == run.id)
        ).scalar_one()
    assert result_step == "total"


def test_submit_makes_a_new_run_every_call(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    made = [wf.submit(engine, {"same": "input"}) for _ in range(3)]
    assert len({run.id for run in made}) == 3
    assert all(run.key is None for run in made)
    assert count_runs(engine, name) == 3


def test_submit_tx_makes_a_new_run_every_call(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    with engine.begin() as conn:
        made = [wf.submit_tx(conn, 1) for _ in range(3)]
    assert len({run.id for run in made}) == 3
    assert run_ids(engine, name) == {run.id for run in made}


def test_submit_once_does_not_collide_with_keyless_runs(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    wf.submit(engine, 1)
    _, created = wf.submit_once(engine, "k", 1)
    assert created


def test_tx_forms_accept_a_connection(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    with engine.connect() as conn:
        with conn.begin():
            run, created = wf.submit_once_tx(conn, "k", 1)
            plain = wf.submit_tx(conn, 1)
        assert created
        assert not conn.in_transaction()  # we committed it, cyclone did not end it early
    assert run_ids(engine, name) == {run.id, plain.id}


def test_tx_forms_accept_an_orm_session_and_join_its_transaction(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    with Session(bind=engine) as session:
        run, created = wf.submit_once_tx(session, "k", 1)
        plain = wf.submit_tx(session, 1)
        assert created
        assert count_runs(session.connection(), name) == 2
        session.rollback()
    assert count_runs(engine, name) == 0

    with Session(bind=engine) as session:
        run, created = wf.submit_once_tx(session, "k", 1)
        plain = wf.submit_tx(session, 1)
        assert created
        session.commit()
    assert run_ids(engine, name) == {run.id, plain.id}


def test_tx_forms_join_a_session_bound_to_an_outer_transaction(
    conn: sa.Connection, name: str
) -> None:
    wf = workflow(name)
    with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
        _, created = wf.submit_once_tx(session, "k", 1)
        assert created
        session.commit()  # releases the savepoint; the outer transaction is the test's
    assert count_runs(conn, name, "k") == 1


def test_a_bind_form_rejects_a_connection_and_a_tx_form_rejects_an_engine(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    with pytest.raises(TypeError, match=r"an ORM Session.*got sqlalchemy\.engine\.base\.Engine"):
        wf.submit_once_tx(engine, "k", 1)  # type: ignore[arg-type]
    with engine.connect() as conn, conn.begin():
        with pytest.raises(TypeError, match=r"Engine or cyclone\.Client"):
            wf.submit_once(conn, "k", 1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"Engine or cyclone\.Client"):
            wf.submit(conn, 1)  # type: ignore[arg-type]
    with Session(bind=engine) as session, pytest.raises(TypeError):
        wf.submit_once(session, "k", 1)  # type: ignore[arg-type]
    assert count_runs(engine, name) == 0


def test_a_client_works_where_an_engine_does(engine: sa.Engine, name: str) -> None:
    client = cyclone.Client(engine)
    wf = workflow(name)
    run, created = wf.submit_once(client, "k", 1)
    again, created_again = wf.submit_once(client, "k", 1)
    assert (created, created_again) == (True, False)
    assert again.id == run.id
    made = wf.submit(client, 1)
    [(batch_run, batch_created)] = wf.submit_once_many(client, [("k", 1)])
    assert (batch_run.id, batch_created) == (run.id, False)
    status = client.get_run(run.id)
    assert status is not None
    assert status.key == "k"
    assert run_ids(engine, name) == {run.id, made.id}


def test_purge_frees_the_key(engine: sa.Engine, name: str) -> None:
    wf = workflow(name, 2)
    run, _ = wf.submit_once(engine, "k", 1)
    finish(engine, run.id, cyclone.RunState.COMPLETED, ago=timedelta(hours=1))
    purged = cyclone.Client(engine).purge_terminal_runs(older_than=timedelta(0))
    assert purged >= 1
    assert count_runs(engine, name) == 0
    assert count_jobs(engine, name) == 0
    again, created = wf.submit_once(engine, "k", 1)
    assert created is True
    assert again.id != run.id
    # A new input is fine now: the old run, and its input, are gone.
    with pytest.raises(cyclone.SubmitConflictError):
        wf.submit_once(engine, "k", 2)


def test_purge_keeps_a_running_run_and_its_key(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    cyclone.Client(engine).purge_terminal_runs(older_than=timedelta(0))
    again, created = wf.submit_once(engine, "k", 1)
    assert (again.id, created) == (run.id, False)


def test_run_ids_are_never_reused(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    seen: set[uuid.UUID] = set()
    for _ in range(3):
        with engine.connect() as conn, conn.begin() as tx:
            rolled_back, _ = wf.submit_once_tx(conn, "k", 1)
            tx.rollback()
        assert rolled_back.id not in seen
        seen.add(rolled_back.id)
        run, created = wf.submit_once(engine, "k", 1)
        assert created
        assert run.id not in seen
        seen.add(run.id)
        finish(engine, run.id, cyclone.RunState.FAILED, ago=timedelta(hours=1))
        cyclone.Client(engine).purge_terminal_runs(older_than=timedelta(0))
    assert len(seen) == 6


def test_submit_once_with_a_new_key_is_one_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name)
    wf.plan()
    statements.reset()
    _, created = wf.submit_once(engine, "k", 1)
    assert created
    assert statements.count == 1, statements.statements


def test_submit_once_with_an_existing_key_is_one_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name)
    wf.submit_once(engine, "k", 1)
    statements.reset()
    _, created = wf.submit_once(engine, "k", 1)
    assert not created
    assert statements.count == 1, statements.statements


def test_a_conflict_is_one_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name)
    wf.submit_once(engine, "k", 1)
    statements.reset()
    with pytest.raises(cyclone.SubmitConflictError):
        wf.submit_once(engine, "k", 2)
    assert statements.count == 1, statements.statements


@pytest.mark.parametrize("steps", [1, 20])
def test_submit_once_statements_do_not_grow_with_the_steps(
    engine: sa.Engine, name: str, statements: StatementCounter, steps: int
) -> None:
    wf = workflow(name, steps)
    statements.reset()
    run, created = wf.submit_once(engine, "k", 1)
    new_key = statements.count
    statements.reset()
    wf.submit_once(engine, "k", 1)
    existing_key = statements.count
    statements.reset()
    wf.submit(engine, 1)
    keyless = statements.count
    with engine.begin() as conn:
        statements.reset()
        wf.submit_once_tx(conn, "k2", 1)
        in_tx = statements.count
    assert (new_key, existing_key, keyless, in_tx) == (1, 1, 1, 1)
    assert created
    assert len(job_kinds(engine, run.id)) == steps


def _step_rows(engine: sa.Engine, run_id: uuid.UUID) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(
                    jobs.c.kind,
                    jobs.c.state,
                    jobs.c.pending_deps,
                    jobs.c.deadline,
                    jobs.c.attempt,
                    jobs.c.worker_id,
                )
                .where(jobs.c.run_id == run_id)
                .order_by(jobs.c.kind)
            )
        )


def test_a_submit_writes_the_run_row_only_and_shows_its_steps_blocked_or_available(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name, 3)
    run, _ = wf.submit_once(engine, "k", 1, deadline=timedelta(hours=1))
    assert _step_rows(engine, run.id) == []
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    assert [(s.name, s.state, s.job_id, s.attempt) for s in detail.steps] == [
        ("s0", "available", None, 0),
        ("s1", "blocked", None, 0),
        ("s2", "blocked", None, 0),
    ]


def test_the_claim_that_starts_a_run_creates_its_steps_and_claims_roots_for_free_slots(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("a")(noop)
    wf.step("b")(noop)
    wf.step("c", after=["a", "b"])(noop)
    run, _ = wf.submit_once(engine, "k", 1, deadline=timedelta(hours=1))
    scope = _claim.Scope(queues=None, workflows=(name,), kinds=())
    with _executor.connect(engine) as conn:
        _recorded, claimed = _claim.record_and_claim(
            conn, worker_id="w1", successes=[], scope=scope, limit=1
        )
    deadline = run.status().deadline
    rows = _step_rows(engine, run.id)
    assert [(r.kind, r.state, r.pending_deps, r.attempt, r.worker_id) for r in rows] == [
        ("a", "running", 0, 1, "w1"),
        ("b", "available", 0, 0, None),
        ("c", "blocked", 2, 0, None),
    ]
    assert all(r.deadline == deadline for r in rows)
    assert [(c.run_id, c.kind, c.attempt, c.lease, c.key) for c in claimed] == [
        (run.id, "a", 1, 1, "k")
    ]
    rescue_lost_jobs(engine)  # worker "w1" claimed and is gone: its job goes back


def test_result_on_the_handle_of_an_existing_key_returns_the_result(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.ResultWorkflow[Order, int] = cyclone.ResultWorkflow(name, input=Order, output=int)

    @wf.step()
    def double(ctx: cyclone.StepContext, order: Order) -> int:
        return order.amount * 2

    @wf.result(after=[double])
    def total(ctx: cyclone.StepContext, order: Order) -> int:
        return ctx.output(double) + 1

    run, created = wf.submit_once(engine, "order:1", Order(1, 10))
    assert created
    again, created_again = wf.submit_once(engine, "order:1", Order(1, 10))
    assert created_again is False
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 2
    assert again.result(timeout=10) == 21
    assert run.result(timeout=10) == 21
    assert again.status().state == cyclone.RunState.COMPLETED


def test_the_statement_counter_sees_statements_not_begin_or_commit(
    engine: sa.Engine, statements: StatementCounter
) -> None:
    """What the round-trip tests count: cursor executes; BEGIN and COMMIT are not among them."""
    statements.reset()
    with engine.begin() as conn:
        conn.execute(sa.select(sa.literal(1)))
    assert statements.count == 1
    assert statements.statements[0].startswith("SELECT")


def test_the_statement_counter_sees_statements_sent_on_the_driver_connection(
    engine: sa.Engine, statements: StatementCounter
) -> None:
    """cyclone's fast path bypasses SQLAlchemy's cursor events; the counter still sees it."""
    statements.reset()
    fairy = engine.raw_connection()
    try:
        fairy.driver_connection.execute("SELECT 1")  # type: ignore[union-attr]
    finally:
        fairy.close()
    assert statements.statements == ["SELECT 1"]


def test_a_connection_lost_under_submit_once_is_discarded_by_the_pool(
    database_url: sa.URL, engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    own = sa.create_engine(database_url, pool_size=1, max_overflow=0)
    try:
        wf.submit_once(own, "order:1", {"n": 1})
        with own.connect() as c:
            pid = c.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
        with engine.connect() as c:
            c.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        with pytest.raises(sa.exc.OperationalError) as lost:
            wf.submit_once(own, "order:2", {"n": 2})
        assert lost.value.connection_invalidated is True
        _run, created = wf.submit_once(own, "order:2", {"n": 2})
        assert created is True
        assert count_runs(engine, name) == 2
    finally:
        own.dispose()


def test_a_duplicate_of_a_committed_run_does_not_attempt_the_insert(
    engine: sa.Engine, name: str
) -> None:
    # A BEFORE INSERT trigger fires for every row an INSERT proposes, conflicting or
    # not: the duplicate, fresh or after its run was updated, proposes none.
    wf = workflow(name)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SEQUENCE {name}_tries"))
        conn.execute(
            sa.text(
                f"CREATE FUNCTION {name}_count() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN IF NEW.workflow = '{name}' THEN PERFORM nextval('{name}_tries'); END IF; "
                "RETURN NEW; END $$"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TRIGGER {name}_count BEFORE INSERT ON cyclone_runs "
                f"FOR EACH ROW EXECUTE FUNCTION {name}_count()"
            )
        )

    def tries() -> int:
        with engine.connect() as conn:
            row = conn.execute(sa.text(f"SELECT last_value, is_called FROM {name}_tries")).one()
            return int(row[0]) if row[1] else 0

    try:
        run, created = wf.submit_once(engine, "k", {"n": 1})
        assert created
        assert tries() == 1
        assert wf.submit_once(engine, "k", {"n": 1}) == (run, False)
        with engine.begin() as conn:
            assert wf.submit_once_tx(conn, "k", {"n": 1}) == (run, False)
        finish(engine, run.id, cyclone.RunState.COMPLETED)
        assert wf.submit_once(engine, "k", {"n": 1}) == (run, False)
        assert tries() == 1
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TRIGGER {name}_count ON cyclone_runs"))
            conn.execute(sa.text(f"DROP FUNCTION {name}_count()"))
            conn.execute(sa.text(f"DROP SEQUENCE {name}_tries"))


def definitions_of(engine: sa.Engine, name: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(definitions.c.graph)
                .where(definitions.c.workflow == name)
                .order_by(definitions.c.created_at)
            ).scalars()
        )


def test_a_definition_is_stored_by_the_first_submit_of_its_version_in_that_statement_only(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name, 2)
    wf.plan()
    statements.reset()
    first, _ = wf.submit_once(engine, "a", 1)
    wf.submit(engine, 2)
    wf.submit_once(engine, "b", 3)
    assert statements.count == 3, statements.statements
    assert "cyclone_definitions" in statements.statements[0]
    assert not any("cyclone_definitions" in s for s in statements.statements[1:])
    assert [[s["name"] for s in g["steps"]] for g in definitions_of(engine, name)] == [["s0", "s1"]]
    # A redeploy is a new version, stored once; the older runs keep theirs.
    wf3 = workflow(name, 3)
    wf3.submit(engine, 4)
    wf3.submit(engine, 5)
    assert [len(g["steps"]) for g in definitions_of(engine, name)] == [2, 3]
    assert len(stored_graph(engine, first.id)["steps"]) == 2


def test_a_submit_in_a_transaction_that_rolls_back_leaves_its_definition_stored(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name)
    with engine.connect() as conn:
        wf.submit_once_tx(conn, "k", 1)
        conn.rollback()
    assert count_runs(engine, name) == 0
    assert len(definitions_of(engine, name)) == 1
    statements.reset()
    with engine.begin() as conn:
        run, _ = wf.submit_once_tx(conn, "k", 1)
    assert not any("cyclone_definitions" in s for s in statements.statements)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.status().state is cyclone.RunState.COMPLETED
