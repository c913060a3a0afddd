"""The hot paths' statements: compiled once, sent on the pool's own psycopg connection.

Submit, claim and complete are single statements in autocommit mode. Through a SQLAlchemy
``Connection`` each costs about 0.4 ms of Python on top of its round trip (execution
context, result setup, the isolation switch at checkout and checkin), as much as the
round trip itself. Here the statement is compiled once by SQLAlchemy against the
``Table``s, and each call checks a connection out of the engine's pool (so pool size,
``pool_pre_ping`` and pool events still apply), switches psycopg to autocommit, executes,
and switches back. psycopg prepares the statement after ``prepare_threshold`` executions,
as configured on the engine. Driver errors are raised as SQLAlchemy's ``DBAPIError``
subclasses, as through a ``Connection``.

An engine that logs its SQL (``echo=True``, or the ``sqlalchemy.engine`` logger at INFO)
or has ``before_cursor_execute`` / ``after_cursor_execute`` listeners (OpenTelemetry's
instrumentation, for one) gets the same statements through an autocommit ``Connection``
instead, so that its log and listeners see every one of them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

import psycopg
from sqlalchemy import Connection, Engine, Text, cast, literal_column, null
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from cyclone import _deadline

_DIALECT = pg_psycopg.dialect()  # type: ignore[no-untyped-call]

Row = tuple[Any, ...]


def const(value: str | int | None, type_: Any = Text) -> Any:
    """A constant rendered into the statement's text as a literal, not sent as a parameter.

    A state such as ``'running'`` must be a literal: a generic plan cannot prove that
    ``state = $1`` implies a partial index's ``WHERE state = 'running'``, so PostgreSQL
    would keep re-planning the statement with custom plans on every execution.
    """
    if value is None:
        return cast(null(), type_)
    if isinstance(value, int):
        return literal_column(str(int(value)), type_)
    # An E'' literal reads the same whatever standard_conforming_strings is; a % is
    # doubled once, by literal_column, for psycopg's placeholders.
    escaped = value.replace("\\", "\\\\").replace("'", "''")
    return literal_column(f"E'{escaped}'", type_)


class Compiled:
    """A Core statement rendered once for psycopg, with the values of its literal binds."""

    __slots__ = ("defaults", "sql")

    def __init__(self, clause: ClauseElement) -> None:
        compiled = clause.compile(dialect=_DIALECT)
        assert isinstance(compiled, SQLCompiler)
        self.sql: str = str(compiled)
        self.defaults: dict[str, Any] = {
            name: bind.effective_value
            for bind, name in compiled.bind_names.items()
            if not bind.required
        }


class Executor(Protocol):
    """Runs :class:`Compiled` statements, each its own transaction."""

    def execute(self, stmt: Compiled, params: Mapping[str, Any]) -> list[Row]: ...


class Direct:
    """A pooled psycopg connection in autocommit mode, for :class:`Compiled` statements.

    Statements go through one cursor kept with the connection (in the pool's
    per-connection ``info``, which lives as long as the DBAPI connection): a new cursor
    per statement costs about 6 us of the hot paths' Python.
    """

    __slots__ = ("_cursor", "_driver", "_engine", "_prepare")

    def __init__(
        self,
        engine: Engine,
        driver: psycopg.Connection[Any],
        cursor: psycopg.Cursor[Any],
        prepare: bool | None = None,
    ) -> None:
        self._engine = engine
        self._driver = driver
        self._cursor = cursor
        self._prepare = prepare

    def execute(self, stmt: Compiled, params: Mapping[str, Any]) -> list[Row]:
        """Run one statement (its own transaction) and return its rows; it must return rows."""
        values = {**stmt.defaults, **params}
        try:
            self._cursor.execute(stmt.sql, values, prepare=self._prepare)
            return self._cursor.fetchall()
        except psycopg.Error as exc:
            lost = self._driver.closed or self._driver.broken
            raise _wrap(self._engine, stmt.sql, values, exc, lost) from exc


def _wrap(
    engine: Engine,
    sql: str,
    params: Mapping[str, Any],
    exc: psycopg.Error,
    lost: bool = False,
) -> Exception:
    """The SQLAlchemy exception for ``exc``; ``lost`` marks a connection the pool discards."""
    return sa_exc.DBAPIError.instance(
        sql,
        dict(params),
        exc,
        psycopg.Error,
        connection_invalidated=lost,
        dialect=engine.dialect,
    )


class Observed:
    """The same statements through a SQLAlchemy ``Connection``, whose log and events see them."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def execute(self, stmt: Compiled, params: Mapping[str, Any]) -> list[Row]:
        result = self._conn.exec_driver_sql(stmt.sql, {**stmt.defaults, **params})
        return [tuple(row) for row in result]


_SQL_LOG = logging.getLogger("sqlalchemy.engine.Engine")
_CURSOR = "cyclone.cursor"


def observed(engine: Engine) -> bool:
    """Whether ``engine`` logs SQL or has cursor-event listeners, which the driver path skips."""
    dispatch = engine.dispatch
    return (
        bool(dispatch.before_cursor_execute)
        or bool(dispatch.after_cursor_execute)
        or bool(engine.echo)
        or _SQL_LOG.isEnabledFor(logging.INFO)
    )


@contextmanager
def connect(engine: Engine) -> Iterator[Executor]:
    """Check a connection out of ``engine``'s pool for a few autocommit statements."""
    if observed(engine):
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            yield Observed(conn)
        return
    fairy = engine.raw_connection()
    try:
        driver = _psycopg(engine, fairy.driver_connection)
        previous = driver.autocommit
        try:
            driver.autocommit = True
        except psycopg.Error as exc:
            fairy.invalidate(exc)
            raise _wrap(engine, "SET autocommit", {}, exc, lost=True) from exc
        cursor = fairy.info.get(_CURSOR)
        if cursor is None or cursor.connection is not driver or cursor.closed:
            cursor = fairy.info[_CURSOR] = driver.cursor()
        try:
            yield Direct(engine, driver, cursor)
        finally:
            if driver.closed or driver.broken:
                fairy.invalidate()
            else:
                driver.autocommit = previous
    finally:
        fairy.close()


class Held:
    """A connection of its own for a long-lived loop's statements (a Worker's record and claim).

    It is taken from the engine, so connect events apply, then detached from the pool,
    so it holds no pool slot for the loop's lifetime; it stays in autocommit. Its
    statements are prepared on first use and planned once, generically: a statement
    whose executions are spread over the pool's connections is parsed, then planned
    afresh (0.5 to 1 ms for a claim), about ten times on each before PostgreSQL keeps a
    plan. Neither applies when the engine turns prepared statements off
    (``prepare_threshold=None``, as behind PgBouncer in transaction mode). A lost
    connection raises as on the pooled path, and the next statement opens a new one. An
    engine whose SQL is logged or has cursor-event listeners gets pooled ``Connection``
    calls instead (see :func:`connect`).
    """

    __slots__ = ("_direct", "_engine")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._direct: Direct | None = None

    def execute(self, stmt: Compiled, params: Mapping[str, Any]) -> list[Row]:
        """Run one statement (its own transaction) and return its rows."""
        if observed(self._engine):
            with connect(self._engine) as conn:
                return conn.execute(stmt, params)
        try:
            return (self._direct or self._open()).execute(stmt, params)
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                self.close()
            raise

    def _open(self) -> Direct:
        driver = detached(self._engine)
        prepare = None if driver.prepare_threshold is None else True
        if prepare:
            try:
                driver.execute("SET plan_cache_mode = force_generic_plan")
            except psycopg.Error as exc:
                driver.close()
                raise _wrap(self._engine, "SET plan_cache_mode", {}, exc, lost=True) from exc
        self._direct = Direct(self._engine, driver, driver.cursor(), prepare)
        return self._direct

    def close(self) -> None:
        """Close the connection, if one is open; the next statement opens another."""
        direct, self._direct = self._direct, None
        if direct is not None:
            with contextlib.suppress(psycopg.Error):
                direct._driver.close()


def detached(engine: Engine) -> psycopg.Connection[Any]:
    """A psycopg connection in autocommit, taken from ``engine`` (its connect events
    apply) and detached from its pool: the caller owns it and closes it. TCP keepalives
    are on (see :func:`cyclone._deadline.keepalive`), as it lives long and may sit idle."""
    fairy = engine.raw_connection()
    driver = _psycopg(engine, fairy.driver_connection)
    fairy.detach()
    driver.autocommit = True
    _deadline.keepalive(driver)
    return driver


def _psycopg(engine: Engine, driver: Any) -> psycopg.Connection[Any]:
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(
            f"cyclone needs the psycopg (3) driver, got {engine.dialect.driver!r}: "
            "use a postgresql+psycopg:// URL"
        )
    return driver


def execute(engine: Engine, stmt: Compiled, params: Mapping[str, Any]) -> list[Row]:
    """One autocommit statement on a pooled connection."""
    with connect(engine) as conn:
        return conn.execute(stmt, params)
