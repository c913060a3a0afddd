"""Turn what a caller passes into a connection: own a transaction (bind) or join theirs (conn).

A ``_tx`` call joins the caller's transaction on any of: a SQLAlchemy ``Connection``, an
ORM ``Session``, a ``scoped_session`` (Flask-SQLAlchemy's ``db.session``), a psycopg 3
``Connection``, or an object of a class registered with :func:`register_adapter` (the
Django integration registers Django's connections). cyclone never commits, rolls back or
closes what it joins. Each kind is turned into an executor of :mod:`cyclone._store.executor`
and the Engine the returned handles use.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import psycopg
from psycopg import pq
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.exc import DBAPIError

from cyclone import errors
from cyclone._store import deadline as _deadline
from cyclone._store import executor as _executor

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, scoped_session


@runtime_checkable
class HasEngine(Protocol):
    """Anything that wraps an Engine, such as :class:`cyclone.Client`."""

    @property
    def engine(self) -> Engine: ...


Bind: TypeAlias = "Engine | HasEngine"
Conn: TypeAlias = "Connection | Session | scoped_session[Any] | psycopg.Connection[Any] | Any"
"""What a ``_tx`` call joins (``Any``: objects of a class given to :func:`register_adapter`)."""

Adapter = Callable[[Any], "tuple[psycopg.Connection[Any], Engine]"]

ACCEPTED = (
    "a SQLAlchemy Connection, an ORM Session, a scoped_session (Flask-SQLAlchemy's "
    "db.session) or a psycopg 3 Connection"
)

_adapters: dict[type, Adapter] = {}
_derived: dict[str, Engine] = {}
_lock = threading.Lock()

DERIVED_POOL_SIZE = 2


def register_adapter(cls: type, adapt: Adapter) -> None:
    """Let ``_tx`` calls take instances of ``cls`` (and its subclasses).

    ``adapt(obj)`` returns the psycopg connection whose current transaction the call
    joins, and the Engine the returned handles (:class:`~cyclone.Run`,
    :class:`~cyclone.Job`) use for ``status()`` and ``wait()``.
    """
    if not isinstance(cls, type) or not callable(adapt):
        raise TypeError("register_adapter(cls, adapt) takes a class and a callable")
    with _lock:
        _adapters[cls] = adapt


def _name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _accepted() -> str:
    extra = ", ".join(f"{cls.__module__}.{cls.__qualname__}" for cls in _adapters)
    return ACCEPTED + (f", or a registered {extra}" if extra else "")


def engine_of(bind: Bind) -> Engine:
    """The Engine behind an Engine or a Client."""
    if isinstance(bind, Engine):
        _check_dialect(bind, bind)
        return bind
    # A Connection has an ``engine`` too, but a bind form would then commit on a connection
    # of its own, outside the caller's transaction: refuse it.
    if isinstance(bind, HasEngine) and not isinstance(bind, Connection):
        _check_dialect(bind.engine, bind)
        return bind.engine
    raise TypeError(
        f"expected a SQLAlchemy Engine or cyclone.Client, got {_name(bind)}; "
        f"the _tx methods take {ACCEPTED}"
    )


@contextmanager
def transaction(bind: Bind) -> Iterator[Connection]:
    """Open, commit (or roll back on error) and close a transaction of our own."""
    engine = engine_of(bind)
    with _schema_errors(engine), engine.begin() as conn:
        yield conn


@contextmanager
def autocommit(bind: Bind) -> Iterator[Connection]:
    """A connection in autocommit mode, for a call whose every write is one statement.

    A single statement is atomic on its own, so this saves the BEGIN and COMMIT round
    trips of a transaction; the mode is a client-side switch of psycopg, reset when the
    connection goes back to the pool.
    """
    engine = engine_of(bind)
    with (
        _schema_errors(engine),
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
    ):
        yield conn


@contextmanager
def _schema_errors(engine: Engine) -> Iterator[None]:
    """Raise the SchemaError a missing table, column or function of cyclone's stands for."""
    try:
        yield
    except DBAPIError as exc:
        schema = _executor.schema_problem(engine, exc)
        if schema is not None:
            raise schema from None
        raise


def joined(conn: Conn) -> tuple[_executor.Executor, Engine]:
    """An executor in the caller's transaction, and the Engine for the handles it returns.

    Raises:
        TypeError: ``conn`` is none of the accepted kinds, or is not PostgreSQL through
            psycopg 3.
        TransactionAbortedError: the caller's transaction already failed; it is left as is.
    """
    # An ORM Session exists only once sqlalchemy.orm is imported: a process that never uses
    # the ORM does not import it here (~50 ms at every start of the CLI or a worker).
    if "sqlalchemy.orm" in sys.modules:
        from sqlalchemy.orm import Session, scoped_session

        if isinstance(conn, scoped_session):
            conn = conn()
        if isinstance(conn, Session):
            _check_dialect(conn.get_bind(), conn)
            conn = conn.connection()
    if isinstance(conn, Connection):
        _check_dialect(conn.engine, conn)
        _check_not_aborted(conn.connection.driver_connection, conn)
        return _executor.Observed(conn), conn.engine
    if isinstance(conn, psycopg.Connection):
        _check_not_aborted(conn, conn)
        engine = derived_engine(conn)
        return _executor.Borrowed(conn, engine), engine
    for cls in type(conn).__mro__:
        adapt = _adapters.get(cls)
        if adapt is not None:
            driver, engine = adapt(conn)
            if not isinstance(driver, psycopg.Connection):
                raise TypeError(
                    f"the adapter registered for {_name(conn)} returned {_name(driver)}, "
                    "not a psycopg 3 Connection"
                )
            _check_not_aborted(driver, conn)
            return _executor.Borrowed(driver, engine), engine
    if isinstance(conn, Engine | HasEngine):
        hint = "; the methods without _tx take an Engine or cyclone.Client"
    else:
        hint = ""
    raise TypeError(f"expected {_accepted()}, got {_name(conn)}{hint}")


def _check_dialect(engine: Any, given: object) -> None:
    dialect = getattr(engine, "dialect", None)
    name = getattr(dialect, "name", None)
    driver = getattr(dialect, "driver", None)
    if name != "postgresql" or driver != "psycopg":
        raise TypeError(
            f"cyclone needs PostgreSQL through psycopg 3, but the {_name(given)} given is "
            f"bound to {name}+{driver}: use a postgresql+psycopg:// URL (a plain "
            "postgresql:// URL means psycopg2 to SQLAlchemy)"
        )


def _check_not_aborted(driver: Any, given: object) -> None:
    if not isinstance(driver, psycopg.Connection):
        raise TypeError(
            f"cyclone needs the psycopg 3 driver; the {_name(given)} given runs on {_name(driver)}"
        )
    if driver.info.transaction_status == pq.TransactionStatus.INERROR:
        raise errors.TransactionAbortedError(
            f"the transaction of the {_name(given)} given has already failed (an earlier "
            "statement raised): roll it back (or to a savepoint) before calling cyclone"
        )


def derived_engine(driver: psycopg.Connection[Any]) -> Engine:
    """An Engine to the database of ``driver`` (same connection parameters, password
    included, and TCP keepalives unless they set theirs), cached per parameters: the
    handles of a psycopg-joined call read through it."""
    info = driver.info
    conninfo = psycopg.conninfo.make_conninfo(info.dsn, password=info.password or None)
    conninfo = psycopg.conninfo.make_conninfo(conninfo, **_deadline.keepalive_params({}, conninfo))
    with _lock:
        engine = _derived.get(conninfo)
        if engine is None:
            engine = create_engine(
                "postgresql+psycopg://",
                creator=lambda: psycopg.connect(conninfo),
                pool_size=DERIVED_POOL_SIZE,
                max_overflow=DERIVED_POOL_SIZE,
                pool_pre_ping=True,
            )
            _derived[conninfo] = engine
        return engine


def forget_derived(engine: Engine) -> bool:
    """Drop ``engine`` from the Engines made for psycopg connections; True if it was one."""
    with _lock:
        keys = [key for key, value in _derived.items() if value is engine]
        for key in keys:
            del _derived[key]
    return bool(keys)
