"""The databases a test touched, checked against cyclone's invariants once the test ended.

tests/conftest.py's autouse fixture calls :func:`after_test` after every test, once the
test's own fixtures are torn down (workers stopped, engines disposed): it stops the
subprocesses the test left running, runs :func:`tests.support.invariants.check` with
``at_rest=True`` on every database :func:`touch`-ed during the test, then drops the
databases given to :func:`drop_after_test`. A fixture that makes a database for one test
touches it and defers its drop here, so that the check runs before the drop.

A database shared by many tests (the session database) may keep a broken row after the
test that broke it failed; each broken row fails only the first test after which it is
seen, so one defect fails one test, not every test that follows.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.engine import URL

from cyclone import migrations
from tests.support import invariants, processes

_touched: dict[str, URL] = {}
_at_head: set[str] = set()
_drops: list[Callable[[], None]] = []
_reported: dict[str, set[tuple[str, str]]] = {}


def touch(url: URL, *, at_head: bool = False) -> None:
    """Check ``url``'s database at rest after the current test; ``at_head``: it is known to
    hold cyclone's schema at head for good (the session database), so that is not read."""
    rendered = url.render_as_string(hide_password=False)
    _touched.setdefault(rendered, url)
    if at_head:
        _at_head.add(rendered)


def drop_after_test(drop: Callable[[], None]) -> None:
    """Run ``drop`` after the current test's check (a test's own database)."""
    _drops.append(drop)


def _key(name: str, row: dict[str, object]) -> tuple[str, str]:
    ids = [f"{column}={row[column]}" for column in ("run_id", "job_id") if column in row]
    return name, ",".join(ids) or repr(sorted(row.items()))


def exists(url: URL) -> bool:
    """Whether ``url``'s database is still there (a test may drop its own database)."""
    admin = sa.create_engine(url.set(database="postgres"), poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            found = conn.execute(
                sa.text("SELECT 1 FROM pg_database WHERE datname = :name"), {"name": url.database}
            ).scalar()
    finally:
        admin.dispose()
    return found is not None


def broken(url: URL) -> dict[str, list[dict[str, object]]]:
    """The invariants broken at rest on ``url``'s database, by name; none when the database
    is gone (the test dropped it) or does not hold cyclone's schema at its head revision
    (the queries are written for it)."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        try:
            conn = engine.connect()
        except sa.exc.OperationalError:
            if not exists(url):
                return {}
            raise
        with conn:
            at_head = url.render_as_string(hide_password=False) in _at_head
            if not at_head and migrations.current_revision(conn) != migrations.head_revision():
                return {}
            return invariants.violations(conn, at_rest=True)
    finally:
        engine.dispose()


def new_violations(url: URL) -> dict[str, list[dict[str, object]]]:
    """:func:`broken`, less the rows already reported for this database."""
    seen = _reported.setdefault(url.render_as_string(hide_password=False), set())
    new: dict[str, list[dict[str, object]]] = {}
    for name, rows in broken(url).items():
        for row in rows:
            key = _key(name, row)
            if key not in seen:
                seen.add(key)
                new.setdefault(name, []).append(row)
    return new


def after_test() -> tuple[list[list[str]], dict[str, dict[str, list[dict[str, object]]]]]:
    """Stop what the test left running, check its databases, drop its own databases.

    Returns the command lines of the subprocesses it had to stop and the new violations
    by database name.
    """
    left_running = processes.stop_started()
    found: dict[str, dict[str, list[dict[str, object]]]] = {}
    try:
        for url in _touched.values():
            new = new_violations(url)
            if new:
                found[str(url.database)] = new
    finally:
        _touched.clear()
        drops = list(_drops)
        _drops.clear()
        failures: list[Exception] = []
        for drop in drops:
            try:
                drop()
            except Exception as exc:  # every database is dropped, the first error raised
                failures.append(exc)
        if failures:
            raise failures[0]
    return left_running, found


def describe(found: dict[str, dict[str, list[dict[str, object]]]]) -> str:
    """A failure message listing each broken invariant and its rows."""
    lines = ["cyclone's invariants are broken at the end of the test:"]
    for database, by_name in found.items():
        for name, rows in by_name.items():
            lines.append(f"  {name} (database {database}):")
            lines.extend(f"    {row}" for row in rows)
    return "\n".join(lines)
