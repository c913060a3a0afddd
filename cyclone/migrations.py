"""Apply and check cyclone's alembic revisions from an installed package or a source checkout.

cyclone keeps its own lineage in ``cyclone_alembic_version``, so it never touches an
application's ``alembic_version`` table; an application may instead take cyclone's
revisions into its own history (the branch labelled ``cyclone``), and the checks here
recognise both.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, func, select, text

from alembic import command
from cyclone import errors

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
    config = Config()
    config.set_main_option("script_location", script_location())
    return config


def head_revision() -> str:
    """The newest revision this version of cyclone ships."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def revision_ids() -> frozenset[str]:
    """Every revision this version of cyclone ships."""
    script = ScriptDirectory.from_config(alembic_config())
    return frozenset(rev.revision for rev in script.walk_revisions())


@dataclass(frozen=True, slots=True)
class Found:
    """Where a database keeps cyclone's revision, and which one it is at."""

    database: str
    revision: str | None
    mode: Literal["own", "shared", "none"]
    """``own``: cyclone's ``cyclone_alembic_version``; ``shared``: cyclone's branch in the
    application's ``alembic_version``; ``none``: cyclone's schema is not installed."""


def find(bind: Engine | Connection) -> Found:
    """Look up the cyclone revision of the database in either mode (a few reads)."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return find(conn)
    database = str(bind.execute(select(func.current_database())).scalar_one())
    own = MigrationContext.configure(bind, opts={"version_table": VERSION_TABLE})
    revision = own.get_current_revision()
    if revision is not None:
        return Found(database, revision, "own")
    if bind.execute(select(func.to_regclass(SHARED_VERSION_TABLE))).scalar() is not None:
        shared = MigrationContext.configure(bind, opts={"version_table": SHARED_VERSION_TABLE})
        ours = sorted(set(shared.get_current_heads()) & revision_ids())
        if ours:
            return Found(database, ours[0], "shared")
    return Found(database, None, "none")


def current_revision(bind: Engine | Connection) -> str | None:
    """The revision the database is at, in either mode; None when cyclone's schema is absent."""
    return find(bind).revision


FIX_OWN = "run `cyclone migrate` or cyclone.upgrade(engine)"
FIX_SHARED = (
    "run `alembic upgrade heads` in your application (cyclone's revisions are in its history)"
)


def problem(found: Found) -> str | None:
    """Why cyclone cannot work on the database described by ``found``; None if it can."""
    head = head_revision()
    if found.revision == head:
        return None
    where = f"database {found.database!r}"
    if found.revision is None:
        return f"{where} has no cyclone schema (no cyclone revision found): {FIX_OWN}"
    table = VERSION_TABLE if found.mode == "own" else SHARED_VERSION_TABLE
    if found.revision not in revision_ids():
        return (
            f"{where} is at cyclone revision {found.revision} ({table}), which this version "
            f"of cyclone does not know (it needs {head}): upgrade cyclone"
        )
    fix = FIX_OWN if found.mode == "own" else FIX_SHARED
    return (
        f"{where} is at cyclone revision {found.revision} ({table}), "
        f"this version needs {head}: {fix}"
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


def _run(bind: Engine | Connection, revision: str, upgrade: bool) -> None:
    logging.getLogger("alembic").setLevel(logging.WARNING)
    config = alembic_config()
    apply = command.upgrade if upgrade else command.downgrade
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            config.attributes["connection"] = conn
            apply(config, revision)
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
        config.attributes["connection"] = bind
        apply(config, revision)


def upgrade(bind: Engine | Connection, revision: str = "head") -> None:
    """Apply cyclone's revisions up to ``revision``, in cyclone's own version table.

    An Engine: in one transaction of its own. A Connection: inside its transaction if one
    is open (``op.get_bind()`` in an application's alembic revision: the revisions commit
    with it), else in one it begins and commits. Safe to call twice and from several
    processes at once: a transaction-level advisory lock serialises callers, and the later
    ones find the schema already at head.
    """
    _run(bind, revision, upgrade=True)


def downgrade(bind: Engine | Connection, revision: str = "base") -> None:
    """Revert cyclone's revisions down to ``revision`` (``base`` removes the schema)."""
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
    logging.getLogger("alembic").setLevel(logging.WARNING)
    buffer = io.StringIO()
    config = Config(output_buffer=buffer)
    config.set_main_option("script_location", script_location())
    target = "head" if from_revision is None else f"{from_revision}:head"
    with _keep_alembic_proxies():
        command.upgrade(config, target, sql=True)
    return buffer.getvalue()
