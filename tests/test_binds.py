"""The ``_tx`` forms join the caller's transaction on every accepted kind, and refuse the rest."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import pq
from psycopg.rows import dict_row
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import cyclone
from cyclone._store import binds as _binds
from tests.support.factories import count_runs, workflow

KINDS = [
    "connection",
    "session",
    "scoped_session",
    "psycopg_transaction_block",
    "psycopg_non_autocommit",
    "adapter",
]


def conninfo(url: URL) -> str:
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


@dataclass
class Wrapped:
    """A stand-in for a framework's connection object, given to ``register_adapter``."""

    driver: psycopg.Connection[Any]
    engine: sa.Engine


_binds.register_adapter(Wrapped, lambda obj: (obj.driver, obj.engine))


@dataclass
class Caller:
    """What a caller passes to a ``_tx`` call, and how it ends its own transaction."""

    bind: Any
    end: Callable[[bool], None]
    """``end(True)`` commits, ``end(False)`` rolls back."""


@contextmanager
def caller(kind: str, engine: sa.Engine, url: URL) -> Iterator[Caller]:
    if kind == "connection":
        with engine.connect() as conn:
            conn.begin()
            yield Caller(conn, lambda ok: conn.commit() if ok else conn.rollback())
    elif kind == "session":
        with Session(engine) as session:
            yield Caller(session, lambda ok: session.commit() if ok else session.rollback())
    elif kind == "scoped_session":
        scoped = scoped_session(sessionmaker(engine))
        try:
            yield Caller(scoped, lambda ok: scoped.commit() if ok else scoped.rollback())
        finally:
            scoped.remove()
    elif kind == "psycopg_transaction_block":
        with psycopg.connect(conninfo(url), autocommit=True) as driver:
            block = driver.transaction()
            block.__enter__()

            def end(ok: bool) -> None:
                if ok:
                    block.__exit__(None, None, None)
                else:
                    block.__exit__(psycopg.Rollback, psycopg.Rollback(), None)

            yield Caller(driver, end)
    elif kind == "psycopg_non_autocommit":
        with psycopg.connect(conninfo(url)) as driver:
            yield Caller(driver, lambda ok: driver.commit() if ok else driver.rollback())
    elif kind == "adapter":
        with psycopg.connect(conninfo(url)) as driver:
            yield Caller(
                Wrapped(driver, engine), lambda ok: driver.commit() if ok else driver.rollback()
            )
    else:
        raise AssertionError(kind)


def transaction_open(bind: Any) -> bool:
    """Whether the caller's transaction is still open on the server, as cyclone left it."""
    if isinstance(bind, Wrapped):
        bind = bind.driver
    if isinstance(bind, scoped_session):
        bind = bind()
    if isinstance(bind, Session):
        bind = bind.connection()
    if isinstance(bind, sa.Connection):
        bind = bind.connection.driver_connection
    assert isinstance(bind, psycopg.Connection)
    return bool(bind.info.transaction_status == pq.TransactionStatus.INTRANS)


@pytest.mark.parametrize("kind", KINDS)
def test_every_bind_kind_joins_and_a_rollback_removes_the_run(
    kind: str, engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = workflow(name)
    with caller(kind, engine, database_url) as c:
        run, created = wf.submit_once_tx(c.bind, "k", {"n": 1})
        assert created
        again, created_again = wf.submit_once_tx(c.bind, "k", {"n": 1})
        assert (again.id, created_again) == (run.id, False)
        wf.submit_tx(c.bind, {"n": 2})
        assert transaction_open(c.bind), "cyclone must not commit the caller's transaction"
        assert count_runs(engine, name) == 0, "not visible before the caller commits"
        c.end(False)
    assert count_runs(engine, name) == 0
    rerun, created = wf.submit_once(engine, "k", {"n": 1})
    assert created
    assert rerun.id != run.id


@pytest.mark.parametrize("kind", KINDS)
def test_every_bind_kind_joins_and_a_commit_keeps_the_run(
    kind: str, engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = workflow(name)

    @cyclone.step(f"{name}_kind")
    def kind_step(ctx: cyclone.StepContext, args: int) -> int:
        return args

    with caller(kind, engine, database_url) as c:
        run, _created = wf.submit_once_tx(c.bind, "k", {"n": 1})
        job = kind_step.enqueue_tx(c.bind, 7, unique="u")
        with pytest.raises(cyclone.DuplicateError):
            kind_step.enqueue_tx(c.bind, 7, unique="u")
        assert transaction_open(c.bind), "a duplicate must not abort the caller's transaction"
        c.end(True)
    assert count_runs(engine, name, "k") == 1
    assert run.status().state == cyclone.RunState.RUNNING
    assert job.status().state == cyclone.JobState.AVAILABLE
    with cyclone.Worker(engine, steps=[kind_step]) as worker:
        worker.drain()
    assert job.result(timeout=10) == 7


def test_a_psycopg_connection_left_in_autocommit_commits_each_statement_itself(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    """Outside a transaction block, psycopg's autocommit applies, as to the caller's own SQL."""
    wf = workflow(name)
    with psycopg.connect(conninfo(database_url), autocommit=True) as driver:
        run, _ = wf.submit_once_tx(driver, "k", 1)
        assert count_runs(engine, name, "k") == 1
        assert not driver.closed
    assert run.status().state == cyclone.RunState.RUNNING


def test_a_psycopg_handle_reads_through_an_engine_of_the_same_database(
    database_url: URL, name: str
) -> None:
    wf = workflow(name)
    with psycopg.connect(conninfo(database_url)) as driver:
        run, _ = wf.submit_once_tx(driver, "k", 1)
        driver.commit()
        assert run.status().id == run.id
        derived = _binds.derived_engine(driver)
        assert derived.url.database is None  # made by the driver's own connection parameters
        with derived.connect() as conn:
            assert conn.exec_driver_sql("select current_database()").scalar() == (
                database_url.database
            )
        cyclone.close(derived)
        assert _binds.derived_engine(driver) is not derived


@pytest.mark.parametrize(
    "bad",
    [object(), {"conn": 1}, "postgresql://localhost/db", uuid.uuid4()],
    ids=["object", "dict", "url", "uuid"],
)
def test_a_wrong_bind_type_is_a_type_error_naming_its_type_and_the_accepted_kinds(
    bad: object, engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    expected = f"{type(bad).__module__}.{type(bad).__qualname__}"
    with pytest.raises(TypeError) as err:
        wf.submit_once_tx(bad, "k", 1)
    message = str(err.value)
    assert expected in message
    for kind in ("SQLAlchemy Connection", "ORM Session", "scoped_session", "psycopg 3 Connection"):
        assert kind in message
    assert "tests.test_binds.Wrapped" in message  # a registered adapter's class is listed
    with pytest.raises(TypeError, match=expected.replace(".", r"\.")):
        workflow(f"{name}x").submit_tx(bad, 1)
    assert count_runs(engine, name) == 0


def test_an_async_psycopg_connection_is_refused_with_its_type(name: str) -> None:
    wf = workflow(name)
    bad = psycopg.AsyncConnection.__new__(psycopg.AsyncConnection)
    with pytest.raises(TypeError, match=r"psycopg\.AsyncConnection"):
        wf.submit_once_tx(bad, "k", 1)


def test_a_session_of_another_database_is_refused_before_anything_is_sent(name: str) -> None:
    other = sa.create_engine("sqlite://")
    try:
        with Session(other) as session:
            with pytest.raises(TypeError, match=r"PostgreSQL through psycopg 3.*sqlite\+pysqlite"):
                workflow(name).submit_once_tx(session, "k", 1)
            assert not session.in_transaction()
    finally:
        other.dispose()


def test_a_connection_whose_transaction_failed_gets_a_typed_error_and_is_left_as_it_was(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = workflow(name)
    with engine.connect() as conn:
        conn.begin()
        with pytest.raises(sa.exc.DBAPIError):
            conn.execute(sa.text("select 1/0"))
        with pytest.raises(cyclone.TransactionAbortedError, match="already failed"):
            wf.submit_once_tx(conn, "k", 1)
        conn.rollback()
        wf.submit_once_tx(conn, "k", 1)
        conn.commit()
    with psycopg.connect(conninfo(database_url)) as driver:
        with pytest.raises(psycopg.errors.DivisionByZero):
            driver.execute("select 1/0")
        with pytest.raises(cyclone.TransactionAbortedError):
            wf.submit_tx(driver, 1)
        with pytest.raises(cyclone.TransactionAbortedError):
            workflow(name).submit_once_tx(Wrapped(driver, engine), "k2", 1)
        assert driver.info.transaction_status == pq.TransactionStatus.INERROR
        driver.rollback()
    assert count_runs(engine, name) == 1


def test_a_worker_given_one_workflow_instead_of_a_list_says_to_pass_a_list(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    with pytest.raises(cyclone.DefinitionError, match=r"workflows=\[wf\]"):
        cyclone.Worker(engine, workflows=wf)  # type: ignore[arg-type]

    @cyclone.step(f"{name}_kind")
    def kind_step(ctx: cyclone.StepContext, args: int) -> None:
        return None

    with pytest.raises(cyclone.DefinitionError, match=r"steps= takes a list"):
        cyclone.Worker(engine, steps=kind_step)  # type: ignore[arg-type]


def test_a_worker_given_a_step_kind_as_a_workflow_or_the_reverse_names_the_mistake(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)

    @cyclone.step(f"{name}_kind")
    def kind_step(ctx: cyclone.StepContext, args: int) -> None:
        return None

    with pytest.raises(cyclone.DefinitionError, match=r"workflows= takes .* not StandaloneStep"):
        cyclone.Worker(engine, workflows=[wf, kind_step])  # type: ignore[list-item]
    with pytest.raises(cyclone.DefinitionError, match=r"steps= takes .* not Workflow"):
        cyclone.Worker(engine, steps=[kind_step, wf])  # type: ignore[list-item]
    with pytest.raises(cyclone.DefinitionError, match=r"workflows= takes .* not str"):
        cyclone.Worker(engine, workflows=[name])  # type: ignore[list-item]
    worker = cyclone.Worker(engine, workflows=(w for w in [wf]), steps=iter([kind_step]))
    assert list(worker.workflows) == [name]
    assert list(worker.steps) == [f"{name}_kind"]


def test_an_adapter_must_return_a_psycopg_connection(engine: sa.Engine, name: str) -> None:
    class Odd:
        pass

    _binds.register_adapter(Odd, lambda obj: (object(), engine))
    with pytest.raises(TypeError, match="not a psycopg 3 Connection"):
        workflow(name).submit_once_tx(Odd(), "k", 1)


def test_an_engine_of_another_driver_is_refused_with_the_url_to_use(name: str) -> None:
    other = sa.create_engine("sqlite://")
    try:
        with pytest.raises(TypeError, match=r"postgresql\+psycopg:// URL"):
            workflow(name).submit_once(other, "k", 1)
        with pytest.raises(TypeError, match=r"sqlite\+pysqlite"):
            cyclone.Worker(other, workflows=[workflow(name)])
    finally:
        other.dispose()


def test_a_psycopg_connection_with_its_own_row_factory_still_joins(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = workflow(name)
    with psycopg.connect(conninfo(database_url), row_factory=dict_row) as driver:
        run, created = wf.submit_once_tx(driver, "k", 1)
        again, created_again = wf.submit_once_tx(driver, "k", 1)
        assert (created, created_again, again.id) == (True, False, run.id)
        assert driver.execute("select 1 as one").fetchone() == {"one": 1}
        driver.commit()
    assert count_runs(engine, name, "k") == 1
