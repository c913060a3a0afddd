"""PostgreSQL helpers: session advisory locks, and transactions that survive a deadlock."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

T = TypeVar("T")

DEADLOCK_DETECTED = "40P01"
MAX_DEADLOCK_RETRIES = 10


def in_transaction_retrying_deadlocks(
    bind: Engine | Connection, work: Callable[[Connection], T]
) -> T:
    """Run ``work`` in a transaction of its own, again if PostgreSQL aborts it for a deadlock.

    User calls that lock a run and then its jobs (cancel, retry, purge) meet workers that
    lock a job and then its run; PostgreSQL breaks such a cycle by aborting one side, and
    when it is this side nothing was changed, so the transaction can simply run again.
    A ``Connection`` (outside a transaction) runs each try in a transaction of its own.
    """
    for attempt in range(MAX_DEADLOCK_RETRIES + 1):
        try:
            if isinstance(bind, Connection):
                with bind.begin():
                    return work(bind)
            with bind.begin() as conn:
                return work(conn)
        except DBAPIError as exc:
            sqlstate = getattr(exc.orig, "sqlstate", None)
            if sqlstate != DEADLOCK_DETECTED or attempt == MAX_DEADLOCK_RETRIES:
                raise
    raise AssertionError("unreachable")


def try_advisory_lock(conn: Connection, key: int) -> bool:
    """Take the session-level advisory lock ``key`` if free; True when taken."""
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar())


def advisory_unlock(conn: Connection, key: int) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
