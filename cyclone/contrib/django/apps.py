"""The Django application: ``"cyclone.contrib.django"`` in ``INSTALLED_APPS``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.db.backends.base.base import NO_DB_ALIAS, BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.utils.connection import ConnectionProxy

from cyclone._store import binds as _binds
from cyclone.contrib.django import _checks, _engines


def _before_maintenance(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Let go of cyclone's connections when Django connects to create or drop a database.

    Django's test runner drops the test database through this maintenance connection; a
    connection cyclone still held to it would make the drop fail ("is being accessed by
    other users"). The pools reconnect on their next use.
    """
    if connection.alias == NO_DB_ALIAS:
        _engines.close_engines()


class CycloneConfig(AppConfig):
    """Registers Django's connections as binds of the ``_tx`` calls; models for the admin."""

    name = "cyclone.contrib.django"
    label = "cyclone"
    verbose_name = "cyclone"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        _binds.register_adapter(ConnectionProxy, _engines.adapt)
        _binds.register_adapter(BaseDatabaseWrapper, _engines.adapt)
        connection_created.connect(_before_maintenance, dispatch_uid="cyclone.close_engines")
        checks.register(_checks.check_settings)
