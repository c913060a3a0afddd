"""Apply and check cyclone's alembic revisions from an installed package or a source checkout.

cyclone keeps its own lineage in ``cyclone_alembic_version``, so it never touches an
application's ``alembic_version`` table; an application may instead take cyclone's
revisions into its own history (the branch labelled ``cyclone``), and the checks here
recognise both.
"""

from __future__ import annotations

import functools
import io
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqlalchemy import Connection, Engine, func, select, text
from sqlalchemy.engine.mock import MockConnection

from cyclone import errors

if TYPE_CHECKING:
    from alembic.config import Config

# alembic is imported by the functions that run it (upgrade, downgrade, upgrade_sql), not
# here: checking the schema (a worker's start, every command of the CLI) reads the
# revision files and the version tables directly, and importing alembic costs a process
# ~0.1 s of CPU.

VERSION_TABLE = "cyclone_alembic_version"
SHARED_VERSION_TABLE = "alembic_version"
_MIGRATION_LOCK = 0x6379636C6F6E65  # "cyclone": serialises concurrent upgrades


def script_location() -> str:
    """The directory holding ``env.py`` and ``versions/``: the checkout's or the wheel's."""
    checkout = Path(__file__).resolve().parent.parent / "alembic"
    if (checkout / "env.py").is_file():
        return str(checkout)
    return str(resources.files("cyclone") / "_alembic")


def alembic_config() -> Config:
    """An alembic Config for cyclone's own revisions (script location set, no URL)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", script_location())
    return config


def head_revision() -> str:
    """The newest revision this version of cyclone ships."""
    return _lineage()[0]


def revision_ids() -> frozenset[str]:
    """Every revision this version of cyclone ships."""
    return _lineage()[1]


_ASSIGNED = re.compile(r"^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(.*?)\s*$", re.MULTILINE)
_QUOTED = re.compile(r"""^(?:"([^"]*)"|'([^']*)')$""")


@functools.cache
def _lineage() -> tuple[str, frozenset[str]]:
    """``(head, every revision)`` of the revisions this version ships, read once a process.

    Each revision file names itself and its parent in plain ``revision = "..."`` and
    ``down_revision = "..."`` lines: reading those is what a process that only checks the
    schema needs, without importing alembic and running every file. A file that does not
    read that simply (a merge, a branch) leaves the answer to alembic's ScriptDirectory.
    """
    read = _read_lineage()
    if read is not None:
        return read
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    head = script.get_current_head()
    assert head is not None
    return head, frozenset(rev.revision for rev in script.walk_revisions())


def _read_lineage() -> tuple[str, frozenset[str]] | None:
    parents: dict[str, str | None] = {}
    for path in (Path(script_location()) / "versions").iterdir():
        if not path.name.endswith(".py") or path.name.startswith("_"):
            continue
        found: dict[str, str | None] = {}
        for name, value in _ASSIGNED.findall(path.read_text(encoding="utf-8")):
            quoted = _QUOTED.match(value)
            if quoted is not None:
                found[name] = quoted.group(1) if quoted.group(1) is not None else quoted.group(2)
            elif value == "None":
                found[name] = None
            else:
                return None
        if "revision" not in found or "down_revision" not in found:
            return None
        revision = found["revision"]
        if revision is None or revision in parents:
            return None
        parents[revision] = found["down_revision"]
    heads = set(parents) - set(parents.values())
    roots = [revision for revision, parent in parents.items() if parent is None]
    if len(heads) != 1 or len(roots) != 1 or not set(parents.values()) <= {None, *parents}:
        return None
    return heads.pop(), frozenset(parents)


OWN_MODE = "own-table mode"
SHARED_MODE = "shared-history mode"


@dataclass(frozen=True, slots=True)
class Found:
    """Where a database keeps cyclone's revision, and which one it is at."""

    database: str
    revision: str | None
    mode: Literal["own", "shared", "none"]
    """``own``: cyclone's ``cyclone_alembic_version`` (the own-table mode); ``shared``:
    cyclone's branch in the application's ``alembic_version`` (the shared-history mode);
    ``none``: cyclone's schema is not installed."""
    version_tables: frozenset[str] = frozenset()
    """Which of ``cyclone_alembic_version`` and ``alembic_version`` exist."""

    @property
    def maybe_shared(self) -> bool:
        """No cyclone revision anywhere, but the application's ``alembic_version`` and not
        cyclone's own table: a shared history after ``alembic downgrade cyclone@base``
        looks exactly like an application of the own-table mode that never migrated
        cyclone, so either command may be the right one."""
        return (
            self.mode == "none"
            and SHARED_VERSION_TABLE in self.version_tables
            and VERSION_TABLE not in self.version_tables
        )


def find(bind: Engine | Connection) -> Found:
    """Look up the cyclone revision of the database in either mode (a few reads)."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return find(conn)
    database = str(bind.execute(select(func.current_database())).scalar_one())
    tables = frozenset(
        table
        for table in (VERSION_TABLE, SHARED_VERSION_TABLE)
        if bind.execute(select(func.to_regclass(table))).scalar() is not None
    )
    if VERSION_TABLE in tables:
        own = _versions(bind, VERSION_TABLE)
        if len(own) > 1:  # alembic's error for a table holding two heads
            from alembic.runtime.migration import MigrationContext

            MigrationContext.configure(
                bind, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
        if own:
            return Found(database, own[0], "own", tables)
    if SHARED_VERSION_TABLE in tables:
        ours = sorted(set(_versions(bind, SHARED_VERSION_TABLE)) & revision_ids())
        if ours:
            return Found(database, ours[0], "shared", tables)
    return Found(database, None, "none", tables)


def _versions(conn: Connection, table: str) -> list[str]:
    """The revisions an alembic version table holds (alembic's heads, read without it)."""
    return list(conn.execute(text(f"SELECT version_num FROM {table}")).scalars())


def current_revision(bind: Engine | Connection) -> str | None:
    """The revision the database is at, in either mode; None when cyclone's schema is absent."""
    return find(bind).revision


FIX_OWN = "run `cyclone migrate` or cyclone.upgrade(engine)"
FIX_SHARED = (
    "run `alembic upgrade heads` in your application (cyclone's revisions are in its history)"
)


def fix_either(migrate: str = "`cyclone migrate` or cyclone.upgrade(engine)") -> str:
    """The advice when the mode cannot be told (see :attr:`Found.maybe_shared`)."""
    return (
        f"run {migrate} ({OWN_MODE}, the default), or `alembic upgrade heads` in your "
        f"application if its alembic history holds cyclone's revisions ({SHARED_MODE})"
    )


def _kept_in(found: Found) -> tuple[str, str]:
    """The version table holding the revision ``found``, and its mode's name."""
    if found.mode == "own":
        return VERSION_TABLE, OWN_MODE
    return SHARED_VERSION_TABLE, SHARED_MODE


def problem(found: Found) -> str | None:
    """Why cyclone cannot work on the database described by ``found``; None if it can."""
    head = head_revision()
    if found.revision == head:
        return None
    where = f"database {found.database!r}"
    if found.revision is None:
        if found.maybe_shared:
            return (
                f"{where} has no cyclone schema (no cyclone revision in {VERSION_TABLE} "
                f"or {SHARED_VERSION_TABLE}): {fix_either()}"
            )
        return f"{where} has no cyclone schema (no cyclone revision found): {FIX_OWN}"
    unknown = unknown_revision(found)
    if unknown is not None:
        return unknown
    table, mode = _kept_in(found)
    fix = FIX_OWN if found.mode == "own" else FIX_SHARED
    return (
        f"{where} is at cyclone revision {found.revision} ({table}, {mode}), "
        f"this version needs {head}: {fix}"
    )


def unknown_revision(found: Found) -> str | None:
    """Why cyclone cannot migrate, or work on, a database at a revision this version does
    not know (a newer cyclone migrated it); None if it knows the revision or finds none."""
    if found.revision is None or found.revision in revision_ids():
        return None
    table, mode = _kept_in(found)
    return (
        f"database {found.database!r} is at cyclone revision {found.revision} ({table}, "
        f"{mode}), which this version of cyclone does not know (it needs "
        f"{head_revision()}): upgrade cyclone"
    )


def wrong_mode(found: Found) -> str | None:
    """Why ``cyclone migrate`` / :func:`upgrade` must not touch the database; None if they may.

    In the shared-history mode cyclone's revisions are recorded in the application's
    ``alembic_version``: applying them again into ``cyclone_alembic_version`` would fail
    on tables that exist (or fork the history), so the application's alembic applies them.
    """
    if found.mode != "shared":
        return None
    return (
        f"database {found.database!r} is in the {SHARED_MODE}: cyclone's revisions are in "
        f"your application's {SHARED_VERSION_TABLE} (at {found.revision}), and "
        f"`cyclone migrate` and cyclone.upgrade() are for the {OWN_MODE}; "
        "run `alembic upgrade heads` (or `alembic downgrade cyclone@base`) in your application"
    )


def check_schema(bind: Engine | Connection) -> None:
    """Raise SchemaError unless the database is at this version's head revision.

    Both modes are recognised: cyclone's own ``cyclone_alembic_version``, and cyclone's
    branch inside the application's ``alembic_version``; the message names the command
    of the mode found.
    """
    message = problem(find(bind))
    if message is not None:
        raise errors.SchemaError(message)


_READ_WRITE = ("SELECT", "INSERT", "UPDATE", "DELETE")
GRANTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        (
            "cyclone_runs",
            "cyclone_jobs",
            "cyclone_schedules",
            "cyclone_signals",
            "cyclone_queues",
            "cyclone_limits",
            "cyclone_limit_keys",
            "cyclone_waiters",
            "cyclone_workers",
        ),
        _READ_WRITE,
    ),
    "cyclone_leader": ("SELECT", "INSERT", "UPDATE"),
    "cyclone_definitions": ("SELECT", "INSERT"),
}
"""The privileges on cyclone's tables that an application's role needs, as the grants of
docs/deployment.md give them (besides ``USAGE`` on the schema and ``SELECT`` on the
version table, which the schema check needs first)."""


def missing_grants(bind: Engine | Connection) -> list[str]:
    """The privileges of :data:`GRANTS` the connecting role lacks (``"UPDATE on
    cyclone_leader"``), in one statement; empty when it has them all (an owner has)."""
    wanted = [
        (table, privilege) for table, privileges in GRANTS.items() for privilege in privileges
    ]
    stmt = select(*(func.has_table_privilege(table, privilege) for table, privilege in wanted))
    with nullcontext(bind) if isinstance(bind, Connection) else bind.connect() as conn:
        held = conn.execute(stmt).one()
    return [
        f"{privilege} on {table}"
        for (table, privilege), ok in zip(wanted, held, strict=True)
        if not ok
    ]


def check_schema_at_start(bind: Engine | Connection) -> None:
    """The check a Worker makes once before it starts.

    Raises SchemaError when the schema is missing or at an older revision. A revision
    this version does not know (a newer cyclone migrated the database, as in a rolling
    deploy that migrates first) is logged as a warning instead: the newer schema is
    expected to keep serving older code.
    """
    found = find(bind)
    message = problem(found)
    if message is None:
        return
    if found.revision is not None and found.revision not in revision_ids():
        logging.getLogger("cyclone.worker").warning("%s; starting anyway", message)
        return
    raise errors.SchemaError(message)


def schema_error(engine: Engine) -> errors.SchemaError | None:
    """The SchemaError for a statement that found no table, column or function of cyclone's.

    Called only on that failure path: it reads the revision on a connection of its own
    (the caller's may be in an aborted transaction). None when the schema is at head (the
    original error then stands) or the lookup itself fails.
    """
    try:
        message = problem(find(engine))
    except Exception:
        return None
    return None if message is None else errors.SchemaError(message)


@contextmanager
def _keep_alembic_proxies() -> Iterator[None]:
    """Put back the ``alembic.op`` and ``alembic.context`` of a migration in progress.

    alembic removes (rather than restores) these module proxies when a command ends, so a
    command run from inside an application's revision would leave that revision's ``op``
    unusable.
    """
    import alembic.context as alembic_context
    import alembic.op as alembic_op

    previous = [getattr(module, "_proxy", None) for module in (alembic_op, alembic_context)]
    try:
        yield
    finally:
        for proxy in previous:
            if proxy is not None:
                proxy._install_proxy()


def _refuse(conn: Connection) -> None:
    """Raise SchemaError, before alembic runs, for a database in the shared-history mode
    or at a revision this version does not know (alembic would fail on it, unclearly)."""
    found = find(conn)
    message = wrong_mode(found) or unknown_revision(found)
    if message is not None:
        raise errors.SchemaError(message)


def _run(bind: Engine | Connection, revision: str, upgrade: bool) -> None:
    from alembic import command

    logging.getLogger("alembic").setLevel(logging.WARNING)
    config = alembic_config()
    apply = command.upgrade if upgrade else command.downgrade
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            _refuse(conn)
            config.attributes["connection"] = conn
            apply(config, revision)
        return
    if _offline(bind):
        _run_offline(revision, upgrade)
        return
    if not isinstance(bind, Connection):
        raise TypeError(
            f"expected a SQLAlchemy Engine or Connection, got {type(bind).__module__}."
            f"{type(bind).__qualname__}"
        )
    # A Connection: join its transaction (an application's revision passes op.get_bind()),
    # or run in one of our own when it has none; the caller commits theirs.
    with _keep_alembic_proxies(), nullcontext() if bind.in_transaction() else bind.begin():
        bind.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        _refuse(bind)
        config.attributes["connection"] = bind
        apply(config, revision)


def _offline(bind: object) -> bool:
    """``op.get_bind()`` under ``alembic ... --sql`` (alembic types it as a Connection)."""
    return isinstance(bind, MockConnection)


def _run_offline(revision: str, upgrade: bool) -> None:
    """Write cyclone's SQL into the script of an application's ``alembic ... --sql``.

    ``op.get_bind()`` is a MockConnection there: nothing can be read from the database,
    so an upgrade starts from nothing (the revision that installs cyclone) and a downgrade
    from this version's head. The statements join the application's script, inside its
    BEGIN/COMMIT.
    """
    import alembic.op as alembic_op

    from alembic import command

    try:
        outer = alembic_op.get_context()
    except NameError:
        raise TypeError(
            "a MockConnection is accepted only inside an alembic revision run with --sql"
        ) from None
    config = alembic_config()
    config.attributes["output_buffer"] = outer.output_buffer
    if upgrade:
        target = revision
    else:
        target = revision if ":" in revision else f"{head_revision()}:{revision}"
    apply = command.upgrade if upgrade else command.downgrade
    with _keep_alembic_proxies():
        apply(config, target, sql=True)


def upgrade(bind: Engine | Connection, revision: str = "head") -> None:
    """Apply cyclone's revisions up to ``revision``, in cyclone's own version table.

    An Engine: in one transaction of its own. A Connection: inside its transaction if one
    is open (``op.get_bind()`` in an application's alembic revision: the revisions commit
    with it), else in one it begins and commits. Safe to call twice and from several
    processes at once: a transaction-level advisory lock serialises callers, and the later
    ones find the schema already at head.

    Under an application's ``alembic upgrade --sql``, ``op.get_bind()`` is a mock
    connection: cyclone's DDL, from nothing up to ``revision``, is written into the
    application's script instead.

    Raises:
        SchemaError: the database keeps cyclone's revisions in the application's
            ``alembic_version`` (the shared-history mode); its alembic applies them.
    """
    _run(bind, revision, upgrade=True)


def downgrade(bind: Engine | Connection, revision: str = "base") -> None:
    """Revert cyclone's revisions down to ``revision`` (``base`` removes the schema).

    Takes what :func:`upgrade` takes; under ``alembic downgrade --sql`` it writes the
    downgrade from this version's head into the application's script.
    """
    _run(bind, revision, upgrade=False)


def upgrade_sql(from_revision: str | None = None) -> str:
    """The offline SQL that upgrades cyclone's schema from ``from_revision`` to head.

    ``None`` gives the whole script for an empty database; a revision gives only the DDL
    after it (and the version table update), for a DBA to review.

    Raises:
        SchemaError: ``from_revision`` is not a revision of this version of cyclone.
    """
    if from_revision is not None and from_revision not in revision_ids():
        raise errors.SchemaError(
            f"{from_revision!r} is not a cyclone revision; known: "
            + ", ".join(sorted(revision_ids()))
        )
    from alembic.config import Config

    from alembic import command

    logging.getLogger("alembic").setLevel(logging.WARNING)
    buffer = io.StringIO()
    config = Config(output_buffer=buffer)
    config.set_main_option("script_location", script_location())
    target = "head" if from_revision is None else f"{from_revision}:head"
    with _keep_alembic_proxies():
        command.upgrade(config, target, sql=True)
    return buffer.getvalue()
