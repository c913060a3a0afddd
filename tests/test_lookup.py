"""Lookup: a run by its key (``get_run``, ``get_run_tx``, ``Client.get_run_by_key``) or by id."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
import sqlalchemy.orm

import cyclone
from tests.conftest import StatementCounter
from tests.support.factories import finish, result_workflow, workflow


def adder(name: str) -> cyclone.ResultWorkflow[int, int]:
    wf: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(name, input=int, output=int)

    @wf.result()
    def plus_one(ctx: cyclone.StepContext, n: int) -> int:
        return n + 1

    return wf


def test_get_run_returns_the_handle_of_the_keys_run(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    submitted, _ = wf.submit_once(engine, "order-42", 1)
    found = wf.get_run(engine, "order-42")
    assert type(found) is cyclone.Run
    assert found == submitted
    assert (found.id, found.workflow, found.key) == (submitted.id, name, "order-42")
    assert found.status().state == cyclone.RunState.RUNNING


def test_get_run_of_a_result_workflow_returns_a_result_handle_that_decodes(
    engine: sa.Engine, name: str
) -> None:
    wf = adder(name)
    wf.submit_once(engine, "k", 41)
    found = wf.get_run(engine, "k")
    assert isinstance(found, cyclone.ResultRun)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert found.result(timeout=10) == 42


def test_get_run_of_an_unknown_key_is_none(engine: sa.Engine, name: str) -> None:
    assert workflow(name).get_run(engine, "never-submitted") is None
    assert result_workflow(name).get_run(engine, "never-submitted") is None


def test_keys_are_per_workflow_name(engine: sa.Engine, name: str) -> None:
    workflow(name).submit_once(engine, "k", 1)
    assert workflow(f"{name}-other").get_run(engine, "k") is None


def test_a_plain_and_a_result_workflow_of_one_name_find_the_same_run(
    engine: sa.Engine, name: str
) -> None:
    run, _ = workflow(name).submit_once(engine, "k", 1)
    found = result_workflow(name).get_run(engine, "k")
    assert isinstance(found, cyclone.ResultRun)
    assert found.id == run.id


def test_get_run_accepts_a_client(engine: sa.Engine, name: str) -> None:
    run, _ = workflow(name).submit_once(engine, "k", 1)
    assert workflow(name).get_run(cyclone.Client(engine), "k") == run


def test_get_run_with_a_bad_key_raises_before_any_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name)
    statements.reset()
    for bad in ("", "a\x00b", "x" * 257):
        with pytest.raises(cyclone.InvalidKeyError):
            wf.get_run(engine, bad)
        with pytest.raises(cyclone.InvalidKeyError):
            cyclone.Client(engine).get_run_by_key(name, bad)
    assert statements.count == 0


def test_get_run_tx_sees_the_transactions_own_uncommitted_run(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    with engine.connect() as conn, conn.begin():
        run, _ = wf.submit_once_tx(conn, "k", 1)
        assert wf.get_run_tx(conn, "k") == run
        assert wf.get_run(engine, "k") is None  # not committed: others do not see it
    assert wf.get_run(engine, "k") == run


def test_get_run_tx_after_a_rollback_finds_nothing(engine: sa.Engine, name: str) -> None:
    wf = adder(name)
    with engine.connect() as conn:
        with conn.begin() as tx:
            wf.submit_once_tx(conn, "k", 1)
            found = wf.get_run_tx(conn, "k")
            assert isinstance(found, cyclone.ResultRun)
            tx.rollback()
        with conn.begin():
            assert wf.get_run_tx(conn, "k") is None


def test_get_run_tx_takes_an_orm_session(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    with sa.orm.Session(engine) as session, session.begin():
        run, _ = wf.submit_once_tx(session, "k", 1)
        assert wf.get_run_tx(session, "k") == run


def test_a_purged_runs_key_finds_nothing(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    finish(engine, run.id, cyclone.RunState.COMPLETED, ago=timedelta(hours=1))
    client = cyclone.Client(engine)
    assert client.purge_terminal_runs(older_than=timedelta(minutes=1)) >= 1
    assert wf.get_run(engine, "k") is None
    assert client.get_run_by_key(name, "k") is None
    with engine.connect() as conn, conn.begin():
        assert wf.get_run_tx(conn, "k") is None
    with pytest.raises(cyclone.NotFoundError):
        wf.run(engine, run.id)


def test_run_by_id_returns_the_typed_handle_with_its_key(engine: sa.Engine, name: str) -> None:
    wf = adder(name)
    submitted, _ = wf.submit_once(engine, "k", 1)
    keyless = wf.submit(engine, 2)
    found = wf.run(engine, submitted.id)
    assert isinstance(found, cyclone.ResultRun)
    assert (found.id, found.key) == (submitted.id, "k")
    assert wf.run(engine, str(keyless.id)).key is None
    assert type(workflow(name).run(engine, keyless.id)) is cyclone.Run


def test_run_by_id_of_a_missing_run_raises_not_found(engine: sa.Engine, name: str) -> None:
    with pytest.raises(cyclone.NotFoundError):
        workflow(name).run(engine, uuid.uuid4())


def test_run_by_id_of_another_workflows_run_raises_not_found(engine: sa.Engine, name: str) -> None:
    run = workflow(name).submit(engine, 1)
    with pytest.raises(cyclone.NotFoundError, match="belongs to workflow"):
        workflow(f"{name}-other").run(engine, run.id)


def test_run_by_id_rejects_what_is_not_an_id(engine: sa.Engine, name: str) -> None:
    with pytest.raises(ValueError, match="badly formed"):
        workflow(name).run(engine, "not-a-uuid")
    bad: Any = 42
    with pytest.raises(TypeError):
        workflow(name).run(engine, bad)


def test_client_get_run_by_key_returns_the_status(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    client = cyclone.Client(engine)
    status = client.get_run_by_key(name, "k")
    assert status is not None
    assert (status.id, status.workflow, status.key) == (run.id, name, "k")
    assert status.state == cyclone.RunState.RUNNING
    assert client.get_run_by_key(wf, "k") == status
    assert client.get_run_by_key(name, "other") is None


@pytest.mark.parametrize(
    "lookup",
    [
        pytest.param(lambda wf, engine, run: wf.get_run(engine, "k"), id="get_run"),
        pytest.param(lambda wf, engine, run: wf.run(engine, run.id), id="run"),
        pytest.param(
            lambda wf, engine, run: cyclone.Client(engine).get_run_by_key(wf.name, "k"),
            id="get_run_by_key",
        ),
    ],
)
def test_each_lookup_is_one_statement(
    engine: sa.Engine, name: str, statements: StatementCounter, lookup: Any
) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    statements.reset()
    assert lookup(wf, engine, run) is not None
    assert statements.count == 1, statements.statements


def test_get_run_tx_is_one_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = workflow(name)
    wf.submit_once(engine, "k", 1)
    with engine.connect() as conn, conn.begin():
        conn.exec_driver_sql("SELECT 1")
        statements.reset()
        assert wf.get_run_tx(conn, "k") is not None
        assert statements.count == 1, statements.statements
