"""The bench's databases: throwaway databases on the server, and the set-up statements.

Every command creates its own database (``<prefix>_<hex>``), installs what it measures
and drops the database ``WITH (FORCE)`` at the end. The bulk loads below are untimed
set-up, sent on plain autocommit psycopg connections.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from bench import workloads

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
"""The server when neither ``--url`` nor ``CYCLONE_DATABASE_URL`` names one."""

CYCLONE_TABLES = "cyclone_signals, cyclone_jobs, cyclone_runs"
RAW_TABLES = "raw_jobs, raw_runs"


def conninfo(url: URL) -> str:
    """The plain libpq form of a SQLAlchemy URL, for raw psycopg connections."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(admin: URL, prefix: str = "cyclone_bench") -> URL:
    """A new empty database ``<prefix>_<hex>`` on ``admin``'s server; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(conninfo(admin), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin.set(database=name)


def drop_database(admin: URL, url: URL) -> None:
    """Drop ``url``'s database, closing whatever sessions still use it."""
    with psycopg.connect(conninfo(admin), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)')


def upgrade(url: URL) -> None:
    """cyclone's schema, through ``cyclone.upgrade``."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        cyclone.upgrade(engine)
    finally:
        engine.dispose()


def install(url: URL) -> None:
    """cyclone's schema and the raw baseline's tables."""
    upgrade(url)
    execute(url, workloads.RAW_DDL)


@contextmanager
def throwaway(admin: URL, prefix: str = "cyclone_bench") -> Iterator[URL]:
    """A database with cyclone's and the raw tables for the block, dropped after it."""
    url = create_database(admin, prefix)
    try:
        install(url)
        yield url
    finally:
        drop_database(admin, url)


def execute(url: URL | str, statement: str, **params: Any) -> tuple[Any, ...] | None:
    """Run one statement in autocommit on a new connection; its first row, if any."""
    dsn = url if isinstance(url, str) else conninfo(url)
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement, params or None)
        return cur.fetchone() if cur.description else None


def count(url: URL | str, statement: str) -> int:
    """The integer a ``SELECT count(*) ...`` returns (0 without a row)."""
    row = execute(url, statement)
    return int(row[0]) if row else 0


def truncate(url: URL | str, tables: str = f"{CYCLONE_TABLES}, {RAW_TABLES}") -> None:
    """Empty the tables, leaving their statistics unknown as on a fresh deploy.

    The empty tables are never ANALYZEd: with autovacuum off (as on the bench server) the
    planner would then believe them empty and cache seq-scan plans per session, which
    grow with every row a figure inserts.
    """
    execute(url, f"TRUNCATE {tables}")


def analyze(url: URL | str, tables: str = f"{CYCLONE_TABLES}, {RAW_TABLES}") -> None:
    """What autovacuum's ANALYZE does on a real server after a bulk load (it is off here).

    Without statistics the claim's cached generic plan reads every available job and
    sorts them (O(backlog)) instead of reading the claim index in order. An empty
    ``tables`` ANALYZEs the whole database.
    """
    execute(url, f"ANALYZE {tables}".strip())


def enqueue_noops(url: URL | str, n: int, kind: str = "bench.noop", max_attempts: int = 3) -> None:
    """``n`` available standalone jobs of ``kind`` in one statement (untimed set-up)."""
    execute(
        url,
        "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
        "SELECT %(kind)s, 'default', 0, 'available', to_jsonb(g), %(attempts)s "
        "FROM generate_series(1, %(n)s) g",
        kind=kind,
        attempts=max_attempts,
        n=n,
    )


def enqueue_raw_noops(url: URL | str, n: int) -> None:
    """``n`` available jobs in the raw baseline's table, in one statement."""
    execute(
        url,
        "INSERT INTO raw_jobs (kind, args) "
        "SELECT 'noop', to_jsonb(g) FROM generate_series(1, %(n)s) g",
        n=n,
    )


def show(url: URL | str, setting: str) -> str:
    """A server setting (``SHOW``), or "?"."""
    row = execute(url, f"SHOW {setting}")
    return str(row[0]) if row else "?"
