"""Maintenance by one leader at a time: deadline expiry, rescue and retention sweeps.

Every worker runs a :class:`Leader` thread with a connection of its own, outside the
application's pool (:func:`side_engine`). It tries a session advisory lock
(:data:`LEADER_LOCK`) every :data:`LEADER_INTERVAL` seconds; the worker that holds it is
the leader and, on that same connection, fails runs past their deadline and hands back
jobs of stopped workers every interval, and sweeps retention every ``sweep_interval``.
The lock belongs to the leader's database session: when the leader's process dies or
its connection is terminated, PostgreSQL releases it, and another worker takes over at
its next try, so within :data:`LEADER_INTERVAL` (plus the time to connect) of the
session ending. A leader host that vanishes without closing its TCP connection holds
the lock until the server notices (TCP keepalives; see docs/operations.md).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, func, select

from cyclone import _fastpath, _rescue, _retry, _sweeper

log = logging.getLogger("cyclone.worker")

LEADER_LOCK = 0x6379636C6C656164  # "cycllead"
LEADER_INTERVAL = 1.0
"""Seconds between a leader's maintenance passes, and between the other workers' tries."""

MAX_BACKOFF = 30.0


def _try_lock(conn: Connection) -> bool:
    taken = conn.execute(select(func.pg_try_advisory_lock(LEADER_LOCK))).scalar()
    conn.commit()
    return bool(taken)


def side_engine(engine: Engine) -> Engine:
    """An Engine on a pool of its own, a copy of ``engine``'s (same creator, connect
    arguments and pool events): the worker's own connections are opened there, so an
    application holding every connection of its pool cannot hold them up, even when
    they reconnect. It keeps ``engine``'s route for session connections
    (``cyclone.configure``). Dispose of it when done."""
    side = create_engine(engine.url, pool=engine.pool.recreate())
    target = _fastpath.session_engine(engine)
    if target is not engine:
        _fastpath.set_session_engine(side, target)
    return side


def dedicated(engine: Engine, *, autocommit: bool) -> Connection:
    """A connection of ``engine`` (a :func:`side_engine`) detached from its pool."""
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
        interval: float = LEADER_INTERVAL,
    ) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.rescue_after = rescue_after
        self.sweep = sweep
        self.sweep_keep = sweep_keep
        self.sweep_interval = sweep_interval
        self.interval = interval
        self.leading = False
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None
        self._failures = 0
        self._lock = threading.Lock()
        self._passed_at: float | None = None

    def start(self) -> None:
        """Run the passes on a thread, the first an interval after the last pass, if any."""
        self._stop.clear()
        thread = threading.Thread(target=self._loop, name="cyclone-leader", daemon=True)
        thread.start()
        self._thread = thread  # only once started: stop() joins it

    def stop(self, timeout: float = 10.0, *, release: bool = True) -> None:
        """Stop the thread and wait; give up the lead (closing the connection releases
        the lock) unless ``release`` is False, for a drain's last pass on the same session."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        if release:
            with self._lock:
                self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        self.leading = False
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
        """One pass: become leader if free, then maintain if leading; True when leading.

        Callers hold ``self._lock``.
        """
        self._passed_at = time.monotonic()
        # The session lock needs a session: the direct route behind PgBouncer, if any.
        session = _fastpath.session_engine(self.engine)
        if self._conn is None:
            self._conn = dedicated(session or self.engine, autocommit=False)
        conn = self._conn
        if session is None:
            return self._tick_pooled(conn)
        if not self.leading:
            self.leading = _try_lock(conn)
            if self.leading:
                log.info("worker %s leads maintenance (rescue, deadlines, sweeps)", self.worker_id)
        if not self.leading:
            return False
        with conn.begin():
            expired = _rescue.expire_runs(conn)
            rescued = _rescue.rescue(conn, self.rescue_after)
        self._report_and_sweep(conn, expired, rescued)
        return True

    def _tick_pooled(self, conn: Connection) -> bool:
        """A pass with no session to hold a lock in (transaction pooling, no direct URL):
        whoever takes the transaction-level lock first leads for this pass only."""
        with conn.begin():
            if not conn.execute(select(func.pg_try_advisory_xact_lock(LEADER_LOCK))).scalar():
                return False
            expired = _rescue.expire_runs(conn)
            rescued = _rescue.rescue(conn, self.rescue_after)
        self._report_and_sweep(conn, expired, rescued)
        return True

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
            runs_deleted, jobs_deleted = _sweeper.sweep_on(conn, self.sweep_keep)
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

    def release(self) -> None:
        """Give up the lead now (a drain's pass failed), keeping nothing open."""
        with self._lock:
            self._close()


def _first_line(exc: Any) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
