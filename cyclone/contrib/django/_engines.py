"""An Engine per Django DATABASES alias, and the bind adapter for Django's connections.

cyclone runs its statements through an Engine; a Django project configures its databases
in ``settings.DATABASES``. The Engine of an alias connects with the same parameters Django
uses (NAME, USER, PASSWORD, HOST, PORT and OPTIONS), in a small pool of its own: it serves
the handles a submit returns (``status()``, ``wait()``) and the worker. A ``_tx`` call on
Django's connection never uses it to write: it joins Django's open transaction instead.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import psycopg
import sqlalchemy as sa
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionDoesNotExist, ConnectionProxy

import cyclone

_DJANGO_ONLY = ("cursor_factory", "context")
"""Connection parameters that only make sense on Django's own connections."""

_DEFAULT_ENGINE_OPTIONS: dict[str, Any] = {
    "pool_size": 2,
    "max_overflow": 4,
    "pool_pre_ping": True,
}

_lock = threading.Lock()
_engines: dict[tuple[str, str], sa.Engine] = {}


def database_alias() -> str:
    """The alias named by ``settings.CYCLONE_DATABASE`` (``"default"`` when unset)."""
    alias = getattr(settings, "CYCLONE_DATABASE", DEFAULT_DB_ALIAS)
    if not isinstance(alias, str):
        raise ImproperlyConfigured(
            f"settings.CYCLONE_DATABASE must be a DATABASES alias, got {type(alias).__name__}"
        )
    return alias


def wrapper_for(alias: str) -> BaseDatabaseWrapper:
    """Django's connection of ``alias``; ImproperlyConfigured when DATABASES has no such alias."""
    try:
        wrapper = connections[alias]
    except ConnectionDoesNotExist:
        known = ", ".join(sorted(connections.settings)) or "none"
        raise ImproperlyConfigured(
            f"cyclone: settings.DATABASES has no alias {alias!r} (aliases: {known})"
        ) from None
    _check_vendor(wrapper)
    return wrapper


def _check_vendor(wrapper: BaseDatabaseWrapper) -> None:
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"cyclone needs PostgreSQL: DATABASES[{wrapper.alias!r}] uses the "
            f"{wrapper.vendor} backend ({wrapper.settings_dict.get('ENGINE')})"
        )


def connect_params(wrapper: BaseDatabaseWrapper) -> dict[str, Any]:
    """psycopg ``connect()`` keyword arguments for the database ``wrapper`` is configured for."""
    params: dict[str, Any] = dict(wrapper.get_connection_params())
    for name in _DJANGO_ONLY:
        params.pop(name, None)
    options = wrapper.settings_dict.get("OPTIONS") or {}
    if "prepare_threshold" not in options:
        # Django turns prepared statements off unless OPTIONS asks for them; cyclone's own
        # connections keep psycopg's default.
        params.pop("prepare_threshold", None)
    return params


def _url(params: dict[str, Any], alias: str) -> sa.URL:
    """Move the URL's parts out of ``params``, leaving the other connect arguments."""
    port = params.pop("port", None)
    try:
        number = int(port) if port else None
    except (TypeError, ValueError):
        raise ImproperlyConfigured(
            f"cyclone: settings.DATABASES[{alias!r}]['PORT'] must be a port number, got {port!r}"
        ) from None
    return sa.URL.create(
        "postgresql+psycopg",
        username=params.pop("user", None),
        password=params.pop("password", None),
        host=params.pop("host", None),
        port=number,
        database=params.pop("dbname", None),
    )


def _engine_options() -> dict[str, Any]:
    """cyclone's pool defaults, updated by ``settings.CYCLONE_ENGINE_OPTIONS``."""
    given = getattr(settings, "CYCLONE_ENGINE_OPTIONS", None)
    if given is None:
        given = {}
    if not isinstance(given, Mapping) or not all(isinstance(name, str) for name in given):
        raise ImproperlyConfigured(
            "settings.CYCLONE_ENGINE_OPTIONS must be a dict of sqlalchemy.create_engine "
            f"keyword arguments, got {type(given).__name__}"
        )
    if "connect_args" in given:
        raise ImproperlyConfigured(
            "settings.CYCLONE_ENGINE_OPTIONS cannot set connect_args: cyclone connects with "
            "the alias's NAME, USER, PASSWORD, HOST, PORT and OPTIONS"
        )
    return {**_DEFAULT_ENGINE_OPTIONS, **given}


def _create_engine(url: sa.URL, params: dict[str, Any], options: dict[str, Any]) -> sa.Engine:
    """``sqlalchemy.create_engine``; options it refuses are a settings mistake, named so."""
    try:
        return sa.create_engine(url, connect_args=params, **options)
    except (TypeError, ValueError, KeyError, AttributeError, sa.exc.ArgumentError) as exc:
        raise ImproperlyConfigured(
            "settings.CYCLONE_ENGINE_OPTIONS: create_engine refused them: "
            + " ".join(str(exc).split())
        ) from exc


def check_alias(alias: str) -> None:
    """Raise ImproperlyConfigured unless ``alias`` is a PostgreSQL alias cyclone can connect
    with (a number for PORT); connects to nothing."""
    _url(connect_params(wrapper_for(alias)), alias)


def check_engine_options() -> None:
    """Raise ImproperlyConfigured unless ``settings.CYCLONE_ENGINE_OPTIONS`` are keyword
    arguments ``create_engine`` takes; connects to nothing."""
    url = sa.URL.create("postgresql+psycopg")
    _create_engine(url, {}, _engine_options()).dispose()


def engine(alias: str | None = None) -> sa.Engine:
    """The Engine cyclone uses for a ``DATABASES`` alias (``settings.CYCLONE_DATABASE`` if None).

    Built on first use and kept for the life of the process; a new one is built when the
    alias's settings change (Django's test runner renames NAME to the test database).
    """
    alias = database_alias() if alias is None else alias
    wrapper = wrapper_for(alias)
    params = connect_params(wrapper)
    cache_key = (alias, repr(sorted(params.items())))
    with _lock:
        found = _engines.get(cache_key)
        if found is None:
            found = _create_engine(_url(params, alias), params, _engine_options())
            _engines[cache_key] = found
        return found


def migration_engine(wrapper: BaseDatabaseWrapper) -> sa.Engine:
    """A pool-less Engine on the database of ``wrapper``, for one migration command."""
    _check_vendor(wrapper)
    params = connect_params(wrapper)
    url = _url(params, wrapper.alias)
    return sa.create_engine(url, connect_args=params, poolclass=sa.NullPool)


def close_engines() -> None:
    """Close every connection cyclone holds for Django's aliases, pools and listeners alike.

    Call it before dropping a database the process still uses; the Django app calls it
    when Django opens its maintenance connection (the one that creates and drops test
    databases), so the test runner's teardown never finds cyclone still connected.
    """
    with _lock:
        engines = list(_engines.values())
        _engines.clear()
    for eng in engines:
        cyclone.close(eng)
        eng.dispose()


def adapt(obj: Any) -> tuple[psycopg.Connection[Any], sa.Engine]:
    """The bind adapter for ``django.db.connection`` and ``connections[alias]``.

    Returns the psycopg connection Django is using in this thread, so the call joins
    whatever transaction Django has open on it (an ``atomic()`` block, or none: then each
    statement commits on its own, as ``Model.save()`` does), and the alias's Engine for
    the handles.
    """
    wrapper = connections[obj.alias] if isinstance(obj, ConnectionProxy) else obj
    if not isinstance(wrapper, BaseDatabaseWrapper):
        raise TypeError(f"expected a Django database connection, got {type(obj).__name__}")
    _check_vendor(wrapper)
    # Django refuses queries in an atomic block whose inner block failed; so does cyclone.
    wrapper.validate_no_broken_transaction()
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError(
            f"cyclone needs Django's psycopg 3 backend, but DATABASES[{wrapper.alias!r}] "
            f"opened a {type(raw).__module__}.{type(raw).__name__} connection"
        )
    return raw, engine(wrapper.alias)
