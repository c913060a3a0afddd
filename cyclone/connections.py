"""What cyclone opens outside an engine's pool: ``cyclone.close`` and ``cyclone.configure``."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from cyclone._store import binds as _binds
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify


def close(engine: Engine) -> None:
    """Close every connection cyclone opened outside ``engine``'s pool.

    That is the LISTEN connection of the notification listener and any connection a
    Worker held; call it after the workers on ``engine`` have stopped (a Worker's
    :meth:`~cyclone.Worker.close` stops it). An Engine cyclone made itself for a psycopg
    connection given to a ``_tx`` call is disposed too. After ``close(engine)`` and
    ``engine.dispose()``, cyclone leaves no backend of ``engine``'s database behind;
    using ``engine`` again afterwards reopens what it needs.
    """
    engine = _binds.engine_of(engine)
    _notify.close(engine)
    _executor.close_detached(engine)
    target = _executor.session_engine(engine)
    if target is not None and target is not engine:
        _executor.close_detached(target)
    if _binds.forget_derived(engine):
        engine.dispose()


def configure(engine: Engine, *, listen_url: str | URL | None) -> None:
    """Say where ``engine``'s session-holding connections go, for PgBouncer in transaction mode.

    One of cyclone's connections keeps state in its server session: the one that
    LISTENs (workers' and ``run.wait()``/``result()``'s wake-ups). Behind a
    transaction-pooling PgBouncer it does not work, so ``listen_url`` names a direct
    route to the same database (a ``postgresql+psycopg://`` URL that bypasses
    PgBouncer); it connects there, one connection per process, outside any pool.
    ``listen_url=None``: no direct route; nothing LISTENs, workers and waiters poll
    (``poll_interval``). The maintenance leader's lease needs no session: it runs through
    the engine either way. Call it before the engine's first Worker or wait; calling it
    again replaces the setting.

    Raises:
        TypeError: ``engine`` is not a psycopg Engine, or ``listen_url`` does not use psycopg.
    """
    if not isinstance(engine, Engine) or engine.dialect.driver != "psycopg":
        raise TypeError("cyclone.configure needs a SQLAlchemy Engine on postgresql+psycopg://")
    target: Engine | None = None
    if listen_url is not None:
        url = sa.make_url(listen_url)
        if url.get_backend_name() != "postgresql" or url.get_driver_name() != "psycopg":
            raise TypeError(
                f"listen_url must be a postgresql+psycopg:// URL, got {url.drivername!r}"
            )
        target = sa.create_engine(url, poolclass=sa.NullPool)
    _notify.close(engine)
    _executor.set_session_engine(engine, target)
