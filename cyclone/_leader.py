"""The maintenance leader's thread: every interval, take the lease if it is free, and
while leading renew it and apply deadlines, rescue (of the jobs and registry rows of
workers that stopped beating) and sweeps, each transaction fenced by the term (the lease
and the fence: :mod:`cyclone._store.leadership`)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine

from cyclone import _retry
from cyclone._store import deadline as _deadline
from cyclone._store import leadership as _leadership
from cyclone._store import rescue as _rescue
from cyclone._store import sweep as _sweeper
from cyclone._store import workers as _workers

log = logging.getLogger("cyclone.worker")

LEADER_INTERVAL = 1.0
"""Seconds between a leader's maintenance passes, and between the other workers' tries
(a third of the lease if that is less)."""

MAX_BACKOFF = 30.0

STOP_WAIT = 1.0
"""Seconds a stopping leader's pass in progress gets to end by itself (a pass takes
milliseconds). A pass still running then waits for something that may not come soon: a
lock (the lease row held by a transaction frozen in it), a server that does not answer,
a long sweep. Its connection is shut down, so the pass fails at once, and the worker's
stop (a SIGTERM) does not wait for it; the server rolls the pass back."""

MIN_LEASE = timedelta(seconds=1)
"""The shortest lease: a pass, fenced by its term, must fit in it, however short a
``rescue_after`` a worker is given (a lease that lapses within a pass refuses it)."""


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
        self.lease = max(rescue_after, MIN_LEASE)
        self.interval = (
            min(LEADER_INTERVAL, self.lease.total_seconds() / 3) if interval is None else interval
        )
        self.term: int | None = None
        self._conn: Connection | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None
        self._failures = 0
        self._lock = threading.Lock()
        self._passed_at: float | None = None
        idle_ms = max(1, int(self.lease.total_seconds() * 1000 / 2))
        self._params = {
            "lease_name": _leadership.LEADERSHIP,
            "lease_holder": worker_id,
            "ttl": self.lease,
        }
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
        ``release`` is False, for a drain's last pass.

        A pass still running after :data:`STOP_WAIT` is cut short (its connection shut
        down), then the thread gets ``timeout`` seconds more. A thread still alive after
        that (opening a connection to a server that does not answer) is left behind,
        the lease with it: it lapses, or is free at once when its server process ends.
        """
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(min(timeout, STOP_WAIT))
            if thread.is_alive():
                self._interrupt()
                thread.join(timeout)
            self._thread = None
            if thread.is_alive():
                log.warning(
                    "worker %s: its maintenance pass did not end within %gs of its stop; "
                    "its lease lapses by itself",
                    self.worker_id,
                    min(timeout, STOP_WAIT) + timeout,
                )
                return
        if release:
            self.release()

    def _interrupt(self) -> None:
        """Shut the socket of the pass's connection down: a statement waiting fails now."""
        conn = self._conn
        if conn is None:
            return
        with contextlib.suppress(Exception):  # closed meanwhile: the pass ended anyway
            driver = _deadline.driver_of(conn)
            if driver is not None:
                _deadline.shutdown(driver)

    def release(self) -> None:
        """Give up the lease now (the next worker takes it at its next try), keeping
        nothing open; a failure to say so leaves the lease to expire."""
        with self._lock:
            term, self.term = self.term, None
            conn = self._conn
            if term is not None and conn is not None:
                try:
                    _leadership.release(conn, {**self._params, "lease_term": term})
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
                if self._stop.is_set():
                    log.info(
                        "worker %s: maintenance pass cut short by its stop (%s)",
                        self.worker_id,
                        _first_line(exc),
                    )
                    break
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
            self._conn = _leadership.dedicated(self.engine, autocommit=False)
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
                pruned = _workers.prune(conn, self.rescue_after, self.worker_id)
            if pruned:
                log.info(
                    "removed %d worker%s silent past %s rescue_after from the registry: %s",
                    len(pruned),
                    "" if len(pruned) == 1 else "s",
                    "its" if len(pruned) == 1 else "their",
                    ", ".join(pruned),
                )
            self._report_and_sweep(conn, expired, rescued)
        except _leadership.LeaseLost:
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
        return _leadership.take(conn, self._params)

    def _fence(self, conn: Connection) -> None:
        """Renew this term's lease and lock it for the transaction, or raise LeaseLost."""
        _leadership.fence(conn, {**self._params, "lease_term": self.term, "idle": self._idle})

    def _report_and_sweep(self, conn: Connection, expired: int, rescued: list[int]) -> None:
        if expired:
            log.info("failed %d runs past their deadline", expired)
        if rescued:
            log.warning(
                "handed back %d job%s of workers that stopped: %s",
                len(rescued),
                "" if len(rescued) == 1 else "s",
                rescued,
            )
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
