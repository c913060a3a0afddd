"""The maintenance leader's lease: take, renew (the fence) and release it; the worker's
own connections beside the application's pool.

Every worker runs a :class:`cyclone._leader.Leader` thread with a connection of its own,
outside the application's pool (:func:`side_engine`). Leadership is a row of
``cyclone_leader`` (:data:`LEADERSHIP`): a ``term`` that only grows, its ``holder`` (a
worker id) and ``expires_at``. Every interval (:data:`cyclone._leader.LEADER_INTERVAL`,
less for a short ``rescue_after``) a worker that does not lead tries to take the lease:
it does when the lease has expired, as the next term, for ``rescue_after`` (the lease's
TTL, at least :data:`cyclone._leader.MIN_LEASE`). The leader renews it at the start of
each maintenance transaction, so a leader that stops passing (frozen by SIGSTOP or a VM
pause, cut off by the network) loses it within ``rescue_after`` of its last pass, and
another worker takes over at its next try: within ``rescue_after`` plus one interval. A
leader that died is replaced sooner: the lease records the server process of its last
renewal (``backend_pid``), and once that process has ended (the server saw the dead
worker's connection close) the lease is free at once; a frozen worker's connection, and
a pooled one behind PgBouncer, stay, so the TTL rules there. Nothing needs a server
session, so the leader works the same through a transaction-pooling PgBouncer.

The fence. Every maintenance transaction (deadline expiry and rescue; each batch of a
sweep) starts with :func:`renew_lease_stmt`, which renews the lease only if this worker
holds it under its term and it has not expired, and keeps the row locked until the
transaction ends. A takeover updates that row, so it cannot commit while a leader's
transaction is open; and once a new term is committed, a leader waking from a freeze
finds its term gone, rolls back before it touched anything, logs the refusal, and can
lead again only by taking a new term. Nothing acts on a stale term.

A frozen leader may hold that row lock: frozen in the middle of a maintenance
transaction, its session sits idle in it. A takeover never waits for it
(:func:`take_lease_stmt` skips a locked row: the lease is not free yet, it tries again
at its next interval), and the leader's transaction sets its own
``idle_in_transaction_session_timeout`` (half the TTL, ``SET LOCAL`` so that it needs no
session), so the server ends a frozen leader's session, rolling its transaction back and
freeing the row, before the lease expires. ``lock_timeout`` or ``NOWAIT`` would only
make the takeover fail sooner; the idle timeout is what frees the row.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    Interval,
    Text,
    bindparam,
    column,
    create_engine,
    exists,
    func,
    or_,
    select,
    table,
    update,
)
from sqlalchemy.dialects.postgresql import insert

from cyclone._store import deadline as _deadline
from cyclone._store import executor as _executor
from cyclone.schema import leader

LEADERSHIP = "maintenance"
"""The name of the maintenance leader's row in ``cyclone_leader``."""


class LeaseLost(Exception):
    """This worker's term is over: the lease expired or another worker took it."""


_ACTIVITY = table("pg_stat_activity", column("pid", Integer))


def _lease_is(*, mine: bool) -> list[Any]:
    held = [leader.c.name == bindparam("lease_name")]
    if mine:
        return [
            *held,
            leader.c.term == bindparam("lease_term"),
            leader.c.holder == bindparam("lease_holder"),
            leader.c.expires_at > func.now(),
        ]
    # Expired, or the server process of the holder's last renewal has ended: its worker
    # died (a frozen worker's stays, and so does a pooled one behind PgBouncer).
    gone = ~exists().where(_ACTIVITY.c.pid == leader.c.backend_pid)
    return [*held, or_(leader.c.expires_at <= func.now(), gone)]


def _until() -> Any:
    return func.now() + bindparam("ttl", type_=Interval)


def take_lease_stmt() -> Any:
    """Take the lease as its next term if it has expired or its holder's server process
    has ended; returns the new term.

    A row another transaction has locked (a leader's maintenance transaction, another
    taker) is skipped, never waited for: the lease is then not free.
    """
    free = select(leader.c.name).where(*_lease_is(mine=False)).with_for_update(skip_locked=True)
    return (
        update(leader)
        .where(leader.c.name.in_(free.scalar_subquery()), *_lease_is(mine=False))
        .values(
            term=leader.c.term + 1,
            holder=bindparam("lease_holder"),
            expires_at=_until(),
            backend_pid=func.pg_backend_pid(),
        )
        .returning(leader.c.term)
    )


def insert_lease_stmt() -> Any:
    """Create the lease as the first term, held by ``:lease_holder``, unless the row exists."""
    return (
        insert(leader)
        .values(
            name=bindparam("lease_name"),
            term=1,
            holder=bindparam("lease_holder"),
            expires_at=_until(),
            backend_pid=func.pg_backend_pid(),
        )
        .on_conflict_do_nothing(index_elements=[leader.c.name])
        .returning(leader.c.term)
    )


def renew_lease_stmt() -> Any:
    """The fence: renew the lease held under ``:lease_term`` if it has not expired, locking it.

    It returns the term, and sets the transaction's ``idle_in_transaction_session_timeout``
    to ``:idle`` (``set_config(..., is_local => true)``): a frozen leader's transaction
    is ended by the server instead of holding the row. No row: the term is over.

    It also turns JIT compilation off for the transaction. A rescue's bound on the
    heartbeats is known only when it runs, so with many running jobs its plan costs more
    than ``jit_above_cost``, and compiling it took 50 ms of every pass for a statement
    that reads a few index pages.
    """
    return (
        update(leader)
        .where(*_lease_is(mine=True))
        .values(expires_at=_until(), backend_pid=func.pg_backend_pid())
        .returning(
            leader.c.term,
            func.set_config(
                "idle_in_transaction_session_timeout", bindparam("idle", type_=Text), True
            ),
            func.set_config("jit", "off", True),
        )
    )


def release_lease_stmt() -> Any:
    """Let the lease expire now if still held under ``:lease_term``: no wait for the next taker."""
    return update(leader).where(*_lease_is(mine=True)).values(expires_at=func.now())


_TAKE = take_lease_stmt()
_INSERT = insert_lease_stmt()
_RENEW = renew_lease_stmt()
_RELEASE = release_lease_stmt()


def side_engine(engine: Engine) -> Engine:
    """An Engine on a pool of its own, a copy of ``engine``'s (same creator, connect
    arguments and pool events): the worker's own connections are opened there, so an
    application holding every connection of its pool cannot hold them up, even when
    they reconnect. :func:`dedicated` opens them with TCP keepalives. Dispose of it when
    done."""
    _deadline.keepalives_for(engine)  # the copied pool connects through engine's dialect
    return create_engine(engine.url, pool=engine.pool.recreate())


def repool(side: Engine, engine: Engine) -> None:
    """Give ``side`` (a :func:`side_engine` of ``engine``, disposed of) a new copy of
    ``engine``'s pool, with the pool events ``engine`` has now. A worker keeps its side
    engine from one serve to the next so that the statements it compiles there stay
    compiled (SQLAlchemy caches them per engine), and repools it at each serve."""
    _deadline.keepalives_for(engine)
    old, side.pool = side.pool, engine.pool.recreate()
    old.dispose()


def dedicated(engine: Engine, *, autocommit: bool) -> Connection:
    """A new connection of ``engine`` (a :func:`side_engine`) detached from its pool,
    with TCP keepalives (:data:`cyclone._store.deadline.KEEPALIVES`)."""
    with _deadline.opening():
        conn = engine.connect()
    try:
        if autocommit:
            conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.detach()
    except BaseException:
        conn.close()
        raise
    return conn


def take(conn: Connection, params: dict[str, Any]) -> int | None:
    """Take the lease if it is free, as the next term (inserting its row the first time);
    the term, or None when another worker holds it."""
    with conn.begin():
        term = _executor.value(conn, _TAKE, params)
        if term is None:
            term = _executor.value(conn, _INSERT, params)
    return None if term is None else int(term)


def fence(conn: Connection, params: dict[str, Any]) -> None:
    """Renew the lease of ``params``' term and lock it for the transaction, or raise
    :class:`LeaseLost`."""
    row = _executor.first(conn, _RENEW, params)
    if row is None:
        raise LeaseLost(params["lease_term"])


def release(conn: Connection, params: dict[str, Any]) -> None:
    """Give up the lease of ``params``' term, in a transaction of its own."""
    with conn.begin():
        _executor.affected(conn, _RELEASE, params)
