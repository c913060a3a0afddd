"""The executor protocol: every statement of cyclone's store is sent through an :class:`Executor`.

An executor runs a statement and returns its rows as tuples (:meth:`Executor.rows`), or
runs one that returns none and says how many rows it changed (:meth:`Executor.affected`).
A statement is either :class:`Compiled` (rendered once, at import, for the hot paths) or
a Core statement built on the call (a listing with its filters). The implementations:

- :func:`connect`: a pooled connection in autocommit, cyclone's own (the bind forms);
- :class:`Held`: a connection of a long-lived loop's own, detached from the pool (a Worker);
- :class:`Observed`: a SQLAlchemy ``Connection``, the caller's transaction (the ``_tx``
  forms), a transaction of cyclone's (``binds.transaction``) or, for an engine whose SQL
  is logged, a pooled one;
- :class:`Borrowed`: a caller's psycopg connection, joining its current transaction.

The store's functions take a ``Connection`` or an ``Executor`` (:data:`Sends`) and send
through :func:`rows`, :func:`first`, :func:`value`, :func:`one`, :func:`column` and
:func:`affected`, which wrap a ``Connection`` in an :class:`Observed`: statements sent
on one ``Connection`` stay in its transaction. No module of the store but this one calls
a connection's or cursor's ``execute`` (tests/test_store_boundary.py checks it).

Every connection opened outside the pool is remembered per engine, and
:func:`close_detached` closes them. The notes below are about the hot paths.

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
import functools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from time import monotonic
from typing import Any, NoReturn, Protocol, TypeAlias

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row
from sqlalchemy import (
    Connection,
    Engine,
    Table,
    Text,
    any_,
    cast,
    event,
    false,
    func,
    literal,
    null,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects.postgresql import ARRAY, REGCLASS
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql import ClauseElement, ColumnElement, Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.type_api import to_instance
from sqlalchemy.sql.visitors import InternalTraversal

from cyclone import errors, migrations
from cyclone._store import deadline as _deadline

_DIALECT = pg_psycopg.dialect()  # type: ignore[no-untyped-call]

Row = tuple[Any, ...]
_NO_PARAMS: Mapping[str, Any] = {}


def const(value: str | int | None, type_: Any = Text) -> Any:
    """A constant rendered into the statement's text as a literal, not sent as a parameter.

    A state such as ``'running'`` must be a literal: a generic plan cannot prove that
    ``state = $1`` implies a partial index's ``WHERE state = 'running'``, so PostgreSQL
    would keep re-planning the statement with custom plans on every execution. The
    literal is rendered by the compiling dialect's own literal processor (quotes, and
    ``%`` for psycopg's placeholders); it reads as written while
    ``standard_conforming_strings`` is on, PostgreSQL's default.
    """
    if value is None:
        return cast(null(), type_)
    return _Const(value, type_)


def one_of(column: Any, values: Sequence[str]) -> Any:
    """``column IN (...)`` over literal ``values`` (see :func:`const`); false when there are
    none. An empty ``IN`` list would be an expanding parameter, which the statements
    compiled once here (:class:`Compiled`) do not expand."""
    return column.in_([const(v) for v in values]) if values else false()


def among(column: Any, ids: Any) -> Any:
    """``column = ANY(ARRAY(ids))``: ``column`` among the values of the one-column select ``ids``.

    The array is an init plan, which a generic plan sizes at a few values, so the rows
    are found through ``column``'s index. ``column IN (ids)`` is planned as a join whose
    estimate for a CTE or a ``jsonb_to_recordset`` is a hundred rows, and on a table of
    some thousand rows the planner then prefers to hash them against a scan of the table.
    """
    values = func.array(ids.scalar_subquery(), type_=ARRAY(column.type))
    return column == any_(values)


class _Const(ColumnElement[Any]):
    """A literal value rendered by the dialect (see :func:`const`)."""

    __visit_name__ = "cyclone_const"
    inherit_cache = True
    _traverse_internals = [
        ("value", InternalTraversal.dp_plain_obj),
        ("type", InternalTraversal.dp_type),
    ]

    def __init__(self, value: str | int, type_: Any) -> None:
        self.value = value
        self.type = to_instance(type_)


@compiles(_Const)
def _render_const(element: _Const, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(literal(element.value, element.type), **{**kw, "literal_binds": True})


class Compiled:
    """A Core statement rendered once for psycopg, with the values of its literal binds."""

    __slots__ = ("defaults", "sql")

    def __init__(self, clause: ClauseElement, *, built: bool = False) -> None:
        # A statement built on the call may have expanding parameters (``IN`` a list): its
        # values are rendered into the text as parameters of their own.
        kw = {"compile_kwargs": {"render_postcompile": True}} if built else {}
        compiled = clause.compile(dialect=_DIALECT, **kw)  # type: ignore[arg-type]
        assert isinstance(compiled, SQLCompiler)
        self.sql: str = str(compiled)
        if "[POSTCOMPILE_" in self.sql:
            # Sent as is, its expanding parameter fails at the server on every call.
            raise ValueError(
                "a statement compiled once has an expanding parameter (IN a list): "
                "use executor.one_of for literal values, or compile it on the call"
            )
        self.defaults: dict[str, Any] = {
            name: bind.effective_value
            for bind, name in compiled.bind_names.items()
            if not bind.required
        }

    def replaced(self, old: str, new: str) -> Compiled:
        """The same statement with every ``old`` of its text replaced by ``new``, not compiled
        again (compiling a claim costs milliseconds; its literals differ only in a number)."""
        copy = object.__new__(Compiled)
        copy.sql = self.sql.replace(old, new)
        copy.defaults = self.defaults
        return copy


Statement: TypeAlias = "Compiled | Executable"
"""What an executor sends: a statement compiled at import, or a Core statement built on
the call (compiled on the call, or sent through SQLAlchemy's ``Connection``)."""


def _compiled(stmt: Statement) -> Compiled:
    if isinstance(stmt, Compiled):
        return stmt
    assert isinstance(stmt, ClauseElement)
    return Compiled(stmt, built=True)


class Executor(Protocol):
    """Sends statements: each its own transaction, or in the caller's (or cyclone's)."""

    def rows(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run a statement that returns rows, and return them as tuples."""
        ...

    def affected(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> int:
        """Run a statement that returns no rows; how many rows it inserted, updated or deleted."""
        ...


class Direct:
    """A pooled psycopg connection in autocommit mode, for :class:`Compiled` statements.

    Statements go through one cursor kept with the connection (in the pool's
    per-connection ``info``, which lives as long as the DBAPI connection): a new cursor
    per statement costs about 6 us of the hot paths' Python.
    """

    __slots__ = ("_cursor", "_driver", "_engine", "_prepare", "_translate")

    def __init__(
        self,
        engine: Engine,
        driver: psycopg.Connection[Any],
        cursor: psycopg.Cursor[Any],
        prepare: bool | None = None,
        translate: bool = True,
    ) -> None:
        self._engine = engine
        self._driver = driver
        self._cursor = cursor
        self._prepare = prepare
        self._translate = translate

    def rows(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run one statement (its own transaction) and return its rows; it must return rows."""
        compiled = stmt if type(stmt) is Compiled else _compiled(stmt)
        values = {**compiled.defaults, **(params or _NO_PARAMS)}
        try:
            self._cursor.execute(compiled.sql, values, prepare=self._prepare)
            return self._cursor.fetchall()
        except psycopg.Error as exc:
            lost = self._driver.closed or self._driver.broken
            _raise(self._engine, compiled.sql, values, exc, lost, translate=self._translate)

    def discard_plans(self) -> None:
        """Drop this session's cached plans (``DISCARD PLANS``): each prepared statement is
        planned again at its next execution."""
        try:
            self._driver.execute("DISCARD PLANS")
        except psycopg.Error as exc:
            lost = self._driver.closed or self._driver.broken
            _raise(self._engine, "DISCARD PLANS", {}, exc, lost, translate=self._translate)

    def affected(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> int:
        compiled = _compiled(stmt)
        values = {**compiled.defaults, **(params or _NO_PARAMS)}
        try:
            self._cursor.execute(compiled.sql, values, prepare=self._prepare)
        except psycopg.Error as exc:
            lost = self._driver.closed or self._driver.broken
            _raise(self._engine, compiled.sql, values, exc, lost, translate=self._translate)
        return self._cursor.rowcount


SCHEMA_SQLSTATES = frozenset({"42P01", "42703", "42883"})
"""undefined_table, undefined_column, undefined_function: cyclone's schema is missing or old."""


def schema_problem(engine: Engine, exc: BaseException) -> errors.SchemaError | None:
    """The SchemaError ``exc`` stands for, if it is one of :data:`SCHEMA_SQLSTATES` and the
    database is indeed not at cyclone's head (looked up only on this failure path)."""
    orig = exc.orig if isinstance(exc, sa_exc.DBAPIError) else exc
    if getattr(orig, "sqlstate", None) not in SCHEMA_SQLSTATES:
        return None
    return migrations.schema_error(engine)


def _raise(
    engine: Engine,
    sql: str,
    params: Mapping[str, Any],
    exc: psycopg.Error,
    lost: bool = False,
    *,
    translate: bool = True,
) -> NoReturn:
    """Raise ``exc`` as SQLAlchemy would, or as the SchemaError it stands for (without the SQL).

    ``translate=False`` leaves the translation to the caller, which first gives its pooled
    connection back: the revision lookup takes a connection of the pool, which may have
    only the one.
    """
    schema = schema_problem(engine, exc) if translate else None
    if schema is not None:
        raise schema from None
    raise _wrap(engine, sql, params, exc, lost) from exc


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
    """Statements through a SQLAlchemy ``Connection``, whose log and events see them.

    A :class:`Compiled` statement is sent as its text; a Core statement as itself, its
    values converted by SQLAlchemy's result processing. Both join the connection's
    transaction, if it has one. ``translate`` raises a statement that finds cyclone's
    schema missing as the SchemaError it stands for (it looks the revision up on another
    connection of the pool: a caller that holds the pool's last one translates after
    giving it back, as :func:`cyclone._store.binds.transaction` does).
    """

    __slots__ = ("_conn", "_translate")

    def __init__(self, conn: Connection, *, translate: bool = True) -> None:
        self._conn = conn
        self._translate = translate

    def _send(self, stmt: Statement, params: Mapping[str, Any] | None) -> Any:
        try:
            if isinstance(stmt, Compiled):
                return self._conn.exec_driver_sql(stmt.sql, {**stmt.defaults, **(params or {})})
            return self._conn.execute(stmt, params)
        except sa_exc.DBAPIError as exc:
            schema = schema_problem(self._conn.engine, exc) if self._translate else None
            if schema is not None:
                raise schema from None
            raise

    def rows(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> list[Row]:
        return [tuple(row) for row in self._send(stmt, params)]

    def affected(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> int:
        return int(self._send(stmt, params).rowcount)


class Borrowed:
    """A caller's psycopg connection: statements join its current transaction.

    Each statement gets a cursor of its own, closed after it; the connection is never
    committed, rolled back or closed here. Errors are raised as SQLAlchemy's, wrapped with
    the dialect of ``engine`` (the engine the returned handles use).
    """

    __slots__ = ("_driver", "_engine")

    def __init__(self, driver: psycopg.Connection[Any], engine: Engine) -> None:
        self._driver = driver
        self._engine = engine

    def rows(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> list[Row]:
        rows, _count = self._send(stmt, params, fetch=True)
        return rows

    def affected(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> int:
        _rows, count = self._send(stmt, params, fetch=False)
        return count

    def _send(
        self, stmt: Statement, params: Mapping[str, Any] | None, *, fetch: bool
    ) -> tuple[list[Row], int]:
        compiled = _compiled(stmt)
        values = {**compiled.defaults, **(params or _NO_PARAMS)}
        try:
            # A plain cursor returning tuples, whatever the connection's factories are.
            with psycopg.Cursor(self._driver, row_factory=tuple_row) as cursor:
                cursor.execute(compiled.sql, values)
                return (cursor.fetchall() if fetch else []), cursor.rowcount
        except psycopg.Error as exc:
            lost = self._driver.closed or self._driver.broken
            _raise(self._engine, compiled.sql, values, exc, lost)


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


def connect(engine: Engine) -> contextlib.AbstractContextManager[Executor]:
    """Check a connection out of ``engine``'s pool for a few autocommit statements.

    A statement that finds cyclone's schema missing raises SchemaError once the
    connection is back in the pool (see :func:`schema_problem`).
    """
    return _Observing(engine) if observed(engine) else _Pooled(engine)


class _Pooled:
    """:func:`connect` on the driver: a pooled psycopg connection switched to autocommit.

    A class rather than a generator: this is on every submit's path, and a generator's
    context manager costs more Python than the statement's own bookkeeping.
    """

    __slots__ = ("_driver", "_engine", "_fairy", "_previous")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __enter__(self) -> Executor:
        engine = self._engine
        fairy = self._fairy = engine.raw_connection()
        try:
            driver = self._driver = _psycopg(engine, fairy.driver_connection)
            self._previous = driver.autocommit
            try:
                driver.autocommit = True
            except psycopg.Error as exc:
                fairy.invalidate(exc)
                raise _wrap(engine, "SET autocommit", {}, exc, lost=True) from exc
            cursor = fairy.info.get(_CURSOR)
            if cursor is None or cursor.connection is not driver or cursor.closed:
                cursor = fairy.info[_CURSOR] = driver.cursor()
        except BaseException:
            fairy.close()
            raise
        return Direct(engine, driver, cursor, translate=False)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        driver, fairy = self._driver, self._fairy
        try:
            if driver.closed or driver.broken:
                fairy.invalidate()
            else:
                driver.autocommit = self._previous
        finally:
            fairy.close()
        _raise_schema_problem(self._engine, exc)


class _Observing:
    """:func:`connect` for an engine whose SQL is logged or listened to: an autocommit
    ``Connection``, so its log and listeners see every statement."""

    __slots__ = ("_conn", "_engine")

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __enter__(self) -> Executor:
        conn = self._conn = self._engine.connect()
        try:
            conn.execution_options(isolation_level="AUTOCOMMIT")
        except BaseException:
            conn.close()
            raise
        return Observed(conn, translate=False)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self._conn.close()
        _raise_schema_problem(self._engine, exc)


def _raise_schema_problem(engine: Engine, exc: BaseException | None) -> None:
    """Raise the SchemaError a failed statement stands for, if it is one."""
    if isinstance(exc, sa_exc.DBAPIError):
        schema = schema_problem(engine, exc)
        if schema is not None:
            raise schema from None


REPLAN_FIRST = 0.125
"""Seconds after a :class:`Held` connection opens until it first looks whether its tables
have grown (see :data:`REPLAN_GROWTH`); the interval then doubles up to
:data:`REPLAN_EVERY`."""
REPLAN_EVERY = 60.0
"""The longest interval between two looks at the size of a :class:`Held` connection's tables."""
REPLAN_STATEMENTS_FIRST = 4
"""Statements after a :class:`Held` connection opens until it looks at its tables' size
whatever the clock says; the count then doubles up to :data:`REPLAN_STATEMENTS_EVERY`. A
worker that starts on a new deployment fills its jobs table within its first statements,
faster than the clock's first looks come, and ran them on plans made for empty tables
until then (bench/README.md, "What holds the unmet goals back")."""
REPLAN_STATEMENTS_EVERY = 1024
"""The most statements between two looks at the size of a :class:`Held` connection's tables."""
REPLAN_GROWTH = 4
"""How many times larger one of a :class:`Held` connection's tables must have grown since
its statements were planned (and at least :data:`REPLAN_FLOOR`) before they are planned
again: each table on its own, as a large table would hide the growth of a small one.

A generic plan is made once, from the tables as they are then: a worker that starts on a
new deployment plans its claim for nearly empty tables, and such a plan scans them whole
(a step's upstream outputs, the jobs a record locks), which costs more with every job
they gain. PostgreSQL makes plans again only when statistics change, which needs an
ANALYZE (autovacuum's comes a minute or more later, or never where it is off); planning
again reads the tables' current size. Planning the claim and the record again costs a
few milliseconds on the next statements, so it happens only when it can change a plan:
each fourfold growth, not on a clock."""
REPLAN_FLOOR = 16 * 1024
"""Bytes: tables smaller than this (two pages) count as this size when their growth is
measured: a jobs table of a few hundred rows is enough for a plan made while it was empty
to scan it, once per step a statement records."""


@functools.lru_cache(maxsize=8)
def _size_of(tables: tuple[Table, ...]) -> Compiled:
    """The statement that reads how many bytes each of ``tables`` takes on disk (its main
    fork), one column each."""
    return Compiled(
        select(*(func.pg_relation_size(cast(const(table.name), REGCLASS)) for table in tables))
    )


def _grown(sizes: tuple[int, ...], planned: tuple[int, ...]) -> bool:
    """Whether a table of ``sizes`` has grown :data:`REPLAN_GROWTH`-fold over ``planned``."""
    return any(
        size >= REPLAN_GROWTH * max(was, REPLAN_FLOOR)
        for size, was in zip(sizes, planned, strict=True)
    )


_SESSION_SETUP = ("SET plan_cache_mode = force_generic_plan", "SET jit = off")
"""The session of a :class:`Held` connection: plans kept (see :class:`Held`), and no JIT
compilation. A plan whose estimate passes ``jit_above_cost`` (the look for earlier
limits, a recursive union, always does) was compiled again at each execution, for
statements that read a few index pages."""


class Held:
    """A connection of its own for a long-lived loop's statements (a Worker's record and claim).

    It is taken from the engine, so connect events apply, then detached from the pool,
    so it holds no pool slot for the loop's lifetime; it stays in autocommit. Its
    statements are prepared on first use and planned once, generically: a statement
    whose executions are spread over the pool's connections is parsed, then planned
    afresh (0.5 to 1 ms for a claim), about ten times on each before PostgreSQL keeps a
    plan. Its session compiles nothing with JIT (:data:`_SESSION_SETUP`). None of this
    applies when the engine turns prepared statements off (``prepare_threshold=None``, as
    behind PgBouncer in transaction mode), which also means a session it cannot keep. A lost
    connection raises as on the pooled path, and the next statement opens a new one. An
    engine whose SQL is logged or has cursor-event listeners gets pooled ``Connection``
    calls instead (see :func:`connect`).

    With ``listen``, each connection it opens LISTENs on those channels before its first
    statement, and ``on_notify`` is called (on the thread that uses it) for every
    notification: those that arrive during a statement, and, after :meth:`fileno`
    became readable, those that :meth:`poll` reads. A loop can so sleep on its own
    socket, woken by the server without a listener thread in between.
    """

    __slots__ = (
        "_direct",
        "_engine",
        "_listen",
        "_listened",
        "_look_every",
        "_look_in",
        "_on_notify",
        "_planned_size",
        "_replan_at",
        "_replan_every",
        "_size",
    )

    def __init__(
        self,
        engine: Engine,
        *,
        listen: tuple[str, ...] = (),
        on_notify: Callable[[], None] | None = None,
        sized: tuple[Table, ...] = (),
    ) -> None:
        self._engine = engine
        self._direct: Direct | None = None
        self._listen = listen
        self._listened = 0
        self._on_notify = on_notify
        self._size = _size_of(sized) if sized else None
        self._planned_size: tuple[int, ...] = ()
        self._replan_at = float("inf")
        self._replan_every = REPLAN_FIRST
        self._look_in = self._look_every = REPLAN_STATEMENTS_FIRST

    def rows(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run one statement (its own transaction) and return its rows."""
        if observed(self._engine):
            with connect(self._engine) as conn:
                return conn.rows(stmt, params)
        try:
            return self._ready().rows(stmt, params)
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                self.close()
            raise

    def affected(self, stmt: Statement, params: Mapping[str, Any] | None = None) -> int:
        """Run one statement (its own transaction); how many rows it changed."""
        if observed(self._engine):
            with connect(self._engine) as conn:
                return conn.affected(stmt, params)
        try:
            return self._ready().affected(stmt, params)
        except sa_exc.DBAPIError as exc:
            if exc.connection_invalidated:
                self.close()
            raise

    def _ready(self) -> Direct:
        """The open connection, its cached plans dropped first when a look at its tables,
        due by its statements or by the clock, finds them grown enough to plan again (see
        :data:`REPLAN_GROWTH`)."""
        direct = self._direct
        if direct is None:
            return self._open()
        if self._size is None or not self._planned_size:  # nothing prepared, nothing to plan
            return direct
        self._look_in -= 1
        if self._look_in <= 0:
            self._look_every = min(self._look_every * 2, REPLAN_STATEMENTS_EVERY)
            self._look_in = self._look_every
        elif monotonic() >= self._replan_at:
            self._replan_every = min(self._replan_every * 2, REPLAN_EVERY)
            self._replan_at = monotonic() + self._replan_every
        else:
            return direct
        sizes = tuple(int(size) for size in direct.rows(self._size)[0])
        if _grown(sizes, self._planned_size):
            direct.discard_plans()
            self._planned_size = sizes
        return direct

    def _open(self) -> Direct:
        driver = detached(self._engine)
        prepare = None if driver.prepare_threshold is None else True
        setup: list[sql.SQL | sql.Composed] = []
        if prepare:
            setup += [sql.SQL(each) for each in _SESSION_SETUP]
        setup += [sql.SQL("LISTEN {}").format(sql.Identifier(c)) for c in self._listen]
        for statement in setup:
            try:
                driver.execute(statement)
            except psycopg.Error as exc:
                driver.close()
                raise _wrap(self._engine, statement.as_string(), {}, exc, lost=True) from exc
        on_notify = self._on_notify
        if on_notify is not None:
            driver.add_notify_handler(lambda _note: on_notify())
        if self._listen:
            self._listened += 1
        direct = self._direct = Direct(self._engine, driver, driver.cursor(), prepare)
        if prepare and self._size is not None:
            self._planned_size = tuple(int(size) for size in direct.rows(self._size)[0])
            self._replan_every = REPLAN_FIRST
            self._replan_at = monotonic() + REPLAN_FIRST
            self._look_in = self._look_every = REPLAN_STATEMENTS_FIRST
        return direct

    def listening(self) -> int | None:
        """Which of its connections (counting from 1) LISTENs now, or None when none is
        open. A notification sent while none listened is lost: a loop that sees this
        change re-reads what a notification would have told it."""
        if not self._listen or self._direct is None or self._direct._driver.closed:
            return None
        return self._listened

    def fileno(self) -> int | None:
        """The open connection's socket, readable when the server sent something; None
        when no connection is open (the next statement opens one)."""
        direct = self._direct
        if direct is None or direct._driver.closed:
            return None
        return direct._driver.pgconn.socket

    def poll(self) -> bool:
        """Read what the server sent while the connection was idle, calling ``on_notify``
        for each notification; False, and the connection closed, if it has failed."""
        direct = self._direct
        if direct is None:
            return False
        pgconn = direct._driver.pgconn
        try:
            with direct._driver.lock:
                pgconn.consume_input()
                notes = 0
                while pgconn.notifies() is not None:
                    notes += 1
        except psycopg.Error:
            self.close()
            return False
        if notes and self._on_notify is not None:
            self._on_notify()
        return True

    def close(self) -> None:
        """Close the connection, if one is open; the next statement opens another."""
        direct, self._direct = self._direct, None
        if direct is not None:
            with contextlib.suppress(psycopg.Error):
                direct._driver.close()


_detached: weakref.WeakKeyDictionary[
    Engine, weakref.WeakKeyDictionary[psycopg.Connection[Any], int]
] = weakref.WeakKeyDictionary()
_detached_lock = threading.Lock()


def detached(engine: Engine) -> psycopg.Connection[Any]:
    """A psycopg connection in autocommit, taken from ``engine`` (its connect events
    apply) and detached from its pool: the caller owns it and closes it, and
    :func:`close_detached` (or ``engine.dispose()``) closes it too. It is a new
    connection, opened with TCP keepalives (:data:`cyclone._store.deadline.KEEPALIVES`), as it
    lives long and may sit idle: not one of the pool's, which have the engine's settings."""
    _deadline.keepalives_for(engine)
    with _deadline.opening():
        fairy = engine.pool.recreate().connect()
    raw = fairy.driver_connection
    fairy.detach()
    try:
        driver = _psycopg(engine, raw)
        driver.autocommit = True  # refused if a connect event left a transaction open
    except BaseException:
        fairy.close()  # detached: closes the connection, which nothing else would
        raise
    with _detached_lock:
        _detached.setdefault(engine, weakref.WeakKeyDictionary())[driver] = os.getpid()
    on_dispose(engine, close_detached)
    return driver


def close_detached(engine: Engine) -> int:
    """Close the connections :func:`detached` opened for ``engine`` in this process.

    Returns how many were open. Connections a parent process opened are left alone: a
    forked child closing them would end the parent's sessions.
    """
    with _detached_lock:
        opened = _detached.pop(engine, weakref.WeakKeyDictionary())
        drivers = [driver for driver, pid in opened.items() if pid == os.getpid()]
    closed = 0
    for driver in drivers:
        if not driver.closed:
            closed += 1
            with contextlib.suppress(psycopg.Error):
                driver.close()
    return closed


_session_engines: weakref.WeakKeyDictionary[Engine, Engine | None] = weakref.WeakKeyDictionary()


def set_session_engine(engine: Engine, target: Engine | None) -> None:
    """Route ``engine``'s session-holding connections (LISTEN) to ``target``.

    ``None`` means ``engine`` has no connection that can hold a session (transaction
    pooling without a direct URL): nothing LISTENs, waiters poll.
    """
    previous = _session_engines.get(engine)
    _session_engines[engine] = target
    still_used = any(previous is other for other in _session_engines.values())
    if previous is not None and not still_used:
        close_detached(previous)
        previous.dispose()


def session_engine(engine: Engine) -> Engine | None:
    """The engine whose connections keep a server session for ``engine``: itself by default."""
    return _session_engines.get(engine, engine)


def on_dispose(engine: Engine, hook: Callable[[Engine], object]) -> None:
    """Call ``hook(engine)`` when ``engine.dispose()`` is called (registered once per hook)."""
    if not event.contains(engine, "engine_disposed", hook):
        event.listen(engine, "engine_disposed", hook)


def _psycopg(engine: Engine, driver: Any) -> psycopg.Connection[Any]:
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(
            f"cyclone needs the psycopg (3) driver, got {engine.dialect.driver!r}: "
            "use a postgresql+psycopg:// URL"
        )
    return driver


def pooled_rows(engine: Engine, stmt: Statement, params: Mapping[str, Any]) -> list[Row]:
    """One autocommit statement on a pooled connection; its rows."""
    with connect(engine) as conn:
        return conn.rows(stmt, params)


Sends: TypeAlias = "Connection | Executor"
"""What the store's functions send on: a SQLAlchemy ``Connection`` (its transaction, if it
has one) or an executor."""


def executor_of(conn: Sends) -> Executor:
    """The executor for ``conn``: a ``Connection`` is wrapped (its transaction is kept)."""
    return Observed(conn, translate=False) if isinstance(conn, Connection) else conn


def rows(conn: Sends, stmt: Statement, params: Mapping[str, Any] | None = None) -> list[Row]:
    """The rows of ``stmt`` sent on ``conn``."""
    return executor_of(conn).rows(stmt, params)


def first(conn: Sends, stmt: Statement, params: Mapping[str, Any] | None = None) -> Row | None:
    """The first row of ``stmt`` sent on ``conn``, or None."""
    found = executor_of(conn).rows(stmt, params)
    return found[0] if found else None


def value(conn: Sends, stmt: Statement, params: Mapping[str, Any] | None = None) -> Any:
    """The first column of the first row of ``stmt`` sent on ``conn``, or None."""
    found = executor_of(conn).rows(stmt, params)
    return found[0][0] if found else None


def one(conn: Sends, stmt: Statement, params: Mapping[str, Any] | None = None) -> Row:
    """The one row of ``stmt`` sent on ``conn``; raises if there are none or several."""
    found = executor_of(conn).rows(stmt, params)
    if not found:
        raise sa_exc.NoResultFound("No row was found when one was required")
    if len(found) > 1:
        raise sa_exc.MultipleResultsFound("Multiple rows were found when exactly one was required")
    return found[0]


def column(conn: Sends, stmt: Statement, params: Mapping[str, Any] | None = None) -> list[Any]:
    """The first column of every row of ``stmt`` sent on ``conn``."""
    return [row[0] for row in executor_of(conn).rows(stmt, params)]


def affected(conn: Sends, stmt: Statement, params: Mapping[str, Any] | None = None) -> int:
    """Send ``stmt``, which returns no rows, on ``conn``; how many rows it changed."""
    return executor_of(conn).affected(stmt, params)


def listen(driver: psycopg.Connection[Any], channels: tuple[str, ...]) -> None:
    """LISTEN on ``channels`` on ``driver`` (a :func:`detached` connection, in autocommit)."""
    for channel in channels:
        driver.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def ping(driver: psycopg.Connection[Any]) -> None:
    """One round trip on ``driver``: it raises if the connection has failed."""
    driver.execute("SELECT 1")
