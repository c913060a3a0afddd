"""The operation of cyclone's Django migrations: apply (or revert) cyclone's alembic revisions.

Django's migration framework records that a migration ran; the schema itself comes from
cyclone's alembic revisions, applied on the database of the connection being migrated.
Each Django migration upgrades to the newest revision the installed cyclone ships, so a
fresh database gets the whole schema from the first one; a cyclone release that adds
revisions adds a Django migration too, and ``manage.py cyclone migrate`` does the same
upgrade by hand. The next one reads (``revision`` is the new head; ``down_to`` the
previous migration's ``revision``)::

    class Migration(migrations.Migration):
        atomic = False
        revision = "cyclone_0007"
        dependencies = [("cyclone", "0001_initial")]
        operations = [apply_revisions(down_to="cyclone_0004")]
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from cyclone import migrations as alembic_migrations
from cyclone.contrib.django import _engines


def apply_revisions(down_to: str) -> migrations.RunPython:
    """Upgrade to cyclone's head; reversed, downgrade to ``down_to`` (``"base"``: no schema).

    The revisions run in a transaction of their own on a connection to the same database
    (alembic drives SQLAlchemy, not Django's cursor), so the Django migration using this
    is declared ``atomic = False``.
    """

    def forward(apps: Any, schema_editor: Any) -> None:
        engine = _engines.migration_engine(schema_editor.connection)
        try:
            alembic_migrations.upgrade(engine)
        finally:
            engine.dispose()

    def backward(apps: Any, schema_editor: Any) -> None:
        engine = _engines.migration_engine(schema_editor.connection)
        try:
            alembic_migrations.downgrade(engine, down_to)
        finally:
            engine.dispose()

    return migrations.RunPython(forward, backward, elidable=False)
