"""PostgreSQL helpers that Core cannot express: session advisory locks."""

from __future__ import annotations

from sqlalchemy import Connection, text


def try_advisory_lock(conn: Connection, key: int) -> bool:
    """Take the session-level advisory lock ``key`` if free; True when taken."""
    return bool(conn.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": key}).scalar())


def advisory_unlock(conn: Connection, key: int) -> None:
    conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
