"""Django system checks of cyclone's settings (``manage.py check``, ``runserver``, ``migrate``).

The settings are read where they are used too, each mistake raising ImproperlyConfigured
there; the checks report them before anything runs, and a ``CYCLONE_`` setting cyclone does
not read (a misspelt name, silently ignored otherwise) as a warning.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from cyclone.contrib.django import _discovery, _engines

SETTINGS = (
    "CYCLONE_DATABASE",
    "CYCLONE_WORKFLOW_MODULES",
    "CYCLONE_ENGINE_OPTIONS",
    "CYCLONE_DASHBOARD_AUTHORIZE",
    "CYCLONE_DASHBOARD_TITLE",
)
"""Every setting the Django app reads."""


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """cyclone.E001: CYCLONE_DATABASE (an alias of DATABASES, on PostgreSQL);
    cyclone.E002: CYCLONE_ENGINE_OPTIONS; cyclone.E003: CYCLONE_WORKFLOW_MODULES;
    cyclone.W001: a ``CYCLONE_`` setting cyclone does not read."""
    found: list[checks.CheckMessage] = []
    for name in dir(settings):
        if name.startswith("CYCLONE_") and name not in SETTINGS:
            close = difflib.get_close_matches(name, SETTINGS, n=1)
            hint = f"did you mean {close[0]}?" if close else f"cyclone reads {', '.join(SETTINGS)}"
            found.append(
                checks.Warning(
                    f"settings.{name} is not a cyclone setting; cyclone ignores it",
                    hint=hint,
                    id="cyclone.W001",
                )
            )
    try:
        _engines.check_alias(_engines.database_alias())
    except ImproperlyConfigured as exc:
        found.append(checks.Error(str(exc).removeprefix("cyclone: "), id="cyclone.E001"))
    try:
        _engines.check_engine_options()
    except ImproperlyConfigured as exc:
        found.append(checks.Error(str(exc), id="cyclone.E002"))
    try:
        _discovery.listed_modules()
    except ImproperlyConfigured as exc:
        found.append(checks.Error(str(exc), id="cyclone.E003"))
    return found
