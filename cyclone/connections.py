"""Closing what cyclone opened outside an engine's pool (``cyclone.close``)."""

from __future__ import annotations

from sqlalchemy import Engine

from cyclone import _binds, _fastpath, _notify


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
    _fastpath.close_detached(engine)
    if _binds.forget_derived(engine):
        engine.dispose()
