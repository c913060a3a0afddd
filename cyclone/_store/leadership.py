"""Maintenance by one leader at a time, elected through a lease: deadlines, rescue, sweeps.

Every worker runs a :class:`Leader` thread with a connection of its own, outside the
application's pool (:func:`side_engine`). Leadership is a row of ``cyclone_leader``
(:data:`LEADERSHIP`): a ``term`` that only grows, its ``holder`` (a worker id) and
``expires_at``. Every interval (:data:`LEADER_INTERVAL`, less for a short
``rescue_after``) a worker that does not lead tries to take the lease: it does when the
lease has expired, as the next term, for ``rescue_after`` (the lease's TTL). The leader
renews it at the start of each maintenance transaction, so a leader that stops passing
(frozen by SIGSTOP or a VM pause, cut off by the network) loses it within
``rescue_after`` of its last pass, and another worker takes over at its next try: within
``rescue_after`` plus one interval. A leader that died is replaced sooner: the lease
records the server process of its last renewal (``backend_pid``), and once that process
has ended (the server saw the dead worker's connection close) the lease is free at once;
a frozen worker's connection, and a pooled one behind PgBouncer, stay, so the TTL rules
there. Nothing needs a server session, so the leader works the same through a
transaction-pooling PgBouncer.

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

import logging
import threading
import time
from datetime import timedelta
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

from cyclone import _retry
from cyclone._store import deadline as _deadline
from cyclone._store import rescue as _rescue
from cyclone._store import sweep as _sweeper
from cyclone.schema import leader

log = logging.getLogger("cyclone.worker")

LEADERSHIP = "maintenance"
"""The name of the maintenance leader's row in ``cyclone_leader``."""

LEADER_INTERVAL = 1.0
"""Seconds between a leader's maintenance passes, and between the other workers' tries
(a third of ``rescue_after`` if that is less)."""

MAX_BACKOFF = 30.0


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


class Leader:
    """One worker's candidacy for maintenance; :meth:`start` runs it on a thread of its own."""

    def __init__(
        self,
        engine: Engine,
        worker_id: str,
        *,
        rescue_after: timedelta,
        sweep: bool,
        sweep_keep: timedelta,
        sweep_interval: float,
        interval: float | None = None,
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.rescue_after = rescue_after
        self.sweep = sweep
        self.sweep_keep = sweep_keep
        self.sweep_interval = sweep_interval
        self.interval = (
            min(LEADER_INTERVAL, rescue_after.total_seconds() / 3) if interval is None else interval
        )
        self.term: int | None = None
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None
        self._failures = 0
        self._lock = threading.Lock()
        self._passed_at: float | None = None
        idle_ms = max(1, int(rescue_after.total_seconds() * 1000 / 2))
        self._params = {"lease_name": LEADERSHIP, "lease_holder": worker_id, "ttl": rescue_after}
        self._idle = f"{idle_ms}ms"

    @property
    def leading(self) -> bool:
        """Whether this worker holds a term (it may have lapsed since its last pass)."""
        return self.term is not None

    def start(self) -> None:
        """Run the passes on a thread, the first an interval after the last pass, if any."""
        self._stop.clear()
        thread = threading.Thread(target=self._loop, name="cyclone-leader", daemon=True)
        thread.start()
        self._thread = thread  # only once started: stop() joins it

    def stop(self, timeout: float = 10.0, *, release: bool = True) -> None:
        """Stop the thread and wait; give up the lease and the connection unless
        ``release`` is False, for a drain's last pass."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if release:
            self.release()

    def release(self) -> None:
        """Give up the lease now (the next worker takes it at its next try), keeping
        nothing open; a failure to say so leaves the lease to expire."""
        with self._lock:
            term, self.term = self.term, None
            conn = self._conn
            if term is not None and conn is not None:
                try:
                    with conn.begin():
                        conn.execute(_RELEASE, {**self._params, "lease_term": term})
                except Exception:
                    log.debug("releasing the maintenance lease failed", exc_info=True)
            self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                log.debug("closing the leader connection failed", exc_info=True)

    def _loop(self) -> None:
        if self._passed_at is not None:
            self._stop.wait(self.interval - (time.monotonic() - self._passed_at))
        while not self._stop.is_set():
            delay = self.interval
            try:
                with self._lock:
                    self.tick()
                if self._failures:
                    log.info("worker %s maintenance connection is back", self.worker_id)
                self._failures = 0
            except Exception as exc:
                with self._lock:
                    self._close()
                self._failures += 1
                delay = _retry.doubling(self.interval, MAX_BACKOFF, self._failures)
                log.warning(
                    "worker %s maintenance failed (%s); retrying in %.1fs",
                    self.worker_id,
                    _first_line(exc),
                    delay,
                )
            self._stop.wait(delay)

    def tick(self) -> bool:
        """One pass: take the lease if free, then maintain if leading; True when it did.

        Callers hold ``self._lock``.
        """
        self._passed_at = time.monotonic()
        if self._conn is None:
            self._conn = dedicated(self.engine, autocommit=False)
        conn = self._conn
        if self.term is None:
            self.term = self._take(conn)
            if self.term is None:
                return False
            log.info(
                "worker %s leads maintenance (rescue, deadlines, sweeps) as term %d",
                self.worker_id,
                self.term,
                extra={"worker_id": self.worker_id, "term": self.term},
            )
        try:
            with conn.begin():
                self._fence(conn)
                expired = _rescue.expire_runs(conn)
                rescued = _rescue.rescue(conn, self.rescue_after)
            self._report_and_sweep(conn, expired, rescued)
        except LeaseLost:
            log.warning(
                "worker %s maintenance refused: its term %d is over (the lease expired or "
                "another worker took it); it leads again only with a new term",
                self.worker_id,
                self.term,
                extra={"worker_id": self.worker_id, "term": self.term},
            )
            self.term = None
            return False
        return True

    def _take(self, conn: Connection) -> int | None:
        with conn.begin():
            term = conn.execute(_TAKE, self._params).scalar()
            if term is None:
                term = conn.execute(_INSERT, self._params).scalar()
        return None if term is None else int(term)

    def _fence(self, conn: Connection) -> None:
        """Renew this term's lease and lock it for the transaction, or raise LeaseLost."""
        row = conn.execute(
            _RENEW, {**self._params, "lease_term": self.term, "idle": self._idle}
        ).first()
        if row is None:
            raise LeaseLost(self.term)

    def _report_and_sweep(self, conn: Connection, expired: int, rescued: list[int]) -> None:
        if expired:
            log.info("failed %d runs past their deadline", expired)
        if rescued:
            log.warning("handed back %d jobs of workers that stopped: %s", len(rescued), rescued)
        moment = time.monotonic()
        if self.sweep and (
            self._last_sweep is None or moment - self._last_sweep >= self.sweep_interval
        ):
            self._last_sweep = moment
            runs_deleted, jobs_deleted = _sweeper.sweep_on(conn, self.sweep_keep, fence=self._fence)
            if runs_deleted or jobs_deleted:
                log.info("sweeper deleted %d runs and %d jobs", runs_deleted, jobs_deleted)

    def once(self) -> bool:
        """A pass on the caller's thread (a drain's first and last), without a sweep: lead
        if free, then apply deadlines and rescue. Returns whether this worker led; when
        another worker leads, its own passes apply them instead.
        """
        previous, self.sweep = self.sweep, False
        try:
            with self._lock:
                return self.tick()
        finally:
            self.sweep = previous


def _first_line(exc: Any) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
