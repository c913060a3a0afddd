"""Turn what a caller passes into a connection: own a transaction (bind) or join theirs (conn)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeAlias, runtime_checkable

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session


@runtime_checkable
class HasEngine(Protocol):
    """Anything that wraps an Engine, such as :class:`cyclone.Client`."""

    @property
    def engine(self) -> Engine: ...


Bind: TypeAlias = "Engine | HasEngine"
Conn: TypeAlias = "Connection | Session"


def engine_of(bind: Bind) -> Engine:
    """The Engine behind an Engine or a Client."""
    if isinstance(bind, Engine):
        return bind
    # A Connection has an ``engine`` too, but a bind form would then commit on a connection
    # of its own, outside the caller's transaction: refuse it.
    if isinstance(bind, HasEngine) and not isinstance(bind, Connection):
        return bind.engine
    raise TypeError(
        f"expected a SQLAlchemy Engine or cyclone.Client, got {type(bind).__name__}; "
        "the _tx methods take a Connection or Session"
    )


@contextmanager
def transaction(bind: Bind) -> Iterator[Connection]:
    """Open, commit (or roll back on error) and close a transaction of our own."""
    with engine_of(bind).begin() as conn:
        yield conn


@contextmanager
def autocommit(bind: Bind) -> Iterator[Connection]:
    """A connection in autocommit mode, for a call whose every write is one statement.

    A single statement is atomic on its own, so this saves the BEGIN and COMMIT round
    trips of a transaction; the mode is a client-side switch of psycopg, reset when the
    connection goes back to the pool.
    """
    with engine_of(bind).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        yield conn


def joined(conn: Conn) -> Connection:
    """The Connection of the caller's transaction; cyclone never commits or rolls it back."""
    if isinstance(conn, Connection):
        return conn
    if isinstance(conn, Session):
        return conn.connection()
    raise TypeError(
        f"expected a SQLAlchemy Connection or Session, got {type(conn).__name__}; "
        "the methods without _tx take an Engine or cyclone.Client"
    )
