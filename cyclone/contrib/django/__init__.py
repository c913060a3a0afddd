"""cyclone for Django (interim stand-in on the dashboard branch: the django branch owns this file).

Only :func:`engine` is here, with the signature of the django branch's, so that
``cyclone.contrib.django.dashboard`` can be built and tested; the merge takes that
branch's module in place of this one.
"""

from __future__ import annotations

import threading

import psycopg
import sqlalchemy as sa
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

__all__ = ["engine"]

_lock = threading.Lock()
_engines: dict[str, sa.Engine] = {}


def engine(alias: str | None = None) -> sa.Engine:
    """The Engine of the ``DATABASES`` alias (``settings.CYCLONE_DATABASE``, default "default")."""
    name = alias or getattr(settings, "CYCLONE_DATABASE", DEFAULT_DB_ALIAS)
    with _lock:
        if name not in _engines:
            params = dict(connections[name].get_connection_params())
            for key in ("cursor_factory", "context"):
                params.pop(key, None)
            _engines[name] = sa.create_engine(
                "postgresql+psycopg://", creator=lambda: psycopg.connect(**params), pool_size=2
            )
        return _engines[name]
