"""Apply and check cyclone's alembic revisions from an installed package or a source checkout.

cyclone keeps its own lineage in ``cyclone_alembic_version``, so it never touches an
application's ``alembic_version`` table.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from alembic import command
from cyclone import errors

VERSION_TABLE = "cyclone_alembic_version"
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


def current_revision(bind: Engine | Connection) -> str | None:
    """The revision the database is at, or None when cyclone's schema is not installed."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return current_revision(conn)
    context = MigrationContext.configure(bind, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def upgrade(bind: Engine, revision: str = "head") -> None:
    """Apply cyclone's revisions up to ``revision`` in one transaction.

    Safe to call twice and from several processes at once: a transaction-level advisory
    lock serialises callers, and the later ones find the schema already at head.
    """
    logging.getLogger("alembic").setLevel(logging.WARNING)
    config = alembic_config()
    with bind.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def downgrade(bind: Engine, revision: str = "base") -> None:
    """Revert cyclone's revisions down to ``revision`` (``base`` removes the schema)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    config = alembic_config()
    with bind.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
        config.attributes["connection"] = conn
        command.downgrade(config, revision)


def check_schema(bind: Engine | Connection) -> None:
    """Raise SchemaError unless the database is at this version's head revision."""
    current = current_revision(bind)
    head = head_revision()
    if current != head:
        raise errors.SchemaError(
            f"cyclone schema is at {current or 'nothing'}, this version needs {head}: "
            "run cyclone.upgrade(engine) or `cyclone migrate`"
        )
