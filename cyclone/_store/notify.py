"""LISTEN/NOTIFY: channel names and one listener thread per engine.

New available jobs notify ``cyclone_jobs_available`` from the statements that insert
them or unblock them (:func:`when_available`); triggers (see the first alembic revision)
notify the same channel for jobs that become available by another update (retried,
rescued, handed back), and
``cyclone_run_finished`` for a run that ends or a standalone job that ends (payload
``job:<id>``). Registering, pausing and resuming a schedule notifies
``cyclone_schedules_changed`` (payload: its name), which wakes the workers' schedulers.

A notification is a doorbell, never the message: whoever is woken re-reads the tables,
and every waiter keeps a slow poll as the fallback for a lost connection.

Work rings only while a worker waits for it (revision cyclone_0019_waiters): every
statement that makes a job available calls ``cyclone_ring()`` once (:func:`ring`), which
notifies only if ``cyclone_waiters`` holds a worker still asleep, so a busy system
commits without the notification queue's lock. The protocol, for a worker about to
sleep (:func:`mark_waiting`, :func:`unsettled`) and a transaction making work:

- the worker records itself (committed), then waits until each of the 64 ring slots has
  been free once (a slot is a shared advisory lock, ``(RING_LOCK, pid % 64)``, that a
  ringing transaction takes before it reads the waiters and holds until it ends), then
  claims once more, then sleeps on its LISTENing connection;
- ``cyclone_ring()`` takes its slot, then reads ``cyclone_waiters`` in a snapshot taken
  after that (a volatile function's query), and notifies if a waiter is recorded; a
  transaction that rang remembers it (the local setting ``cyclone.rang``) and rings no
  more, one that read no waiter reads again at its next call (revision
  cyclone_0030_ring_memo), except that the jobs' row trigger, which rings for each job
  an update makes available, remembers a no for as long as its ``statement_timestamp()``
  lasts (``cyclone.quiet``, revision cyclone_0031_trigger_ring_memo).

A transaction that read no waiter held its slot from before that read until it ended,
so it either ended before the worker's last claim (which sees its work) or read after
the worker's record was committed (and rang). Under REPEATABLE READ or SERIALIZABLE the
snapshot can predate the record: ``cyclone_ring()`` always rings there. A record lapses
at ``waits_until``, a minute after it was made (an idle worker renews it halfway), so a
dead worker's record costs spurious rings for a minute, never a missed one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
from sqlalchemy import (
    Engine,
    Integer,
    Interval,
    Text,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, insert

from cyclone._store import deadline as _deadline
from cyclone._store.executor import (
    Executor,
    const,
    detached,
    listen,
    on_dispose,
    ping,
    session_engine,
)
from cyclone.schema import waiters
from cyclone.states import JobState

log = logging.getLogger(__name__)

JOBS_AVAILABLE = "cyclone_jobs_available"
RUN_FINISHED = "cyclone_run_finished"
SCHEDULES_CHANGED = "cyclone_schedules_changed"
CHANNELS = (JOBS_AVAILABLE, RUN_FINISHED, SCHEDULES_CHANGED)

DEFAULT_RECONNECT_DELAY = 1.0
PING_INTERVAL = 5.0
PING_TIMEOUT = 5.0
RECENT_FINISHED = 16384


Callback = Callable[[str], None]


RING_LOCK = 0x6379636C
"""The first key of the ring slots' advisory locks (``(RING_LOCK, slot)``, slot 0 to 63;
``cycl``, 1668899692 in the migration)."""
RING_SLOTS = 64


def ring() -> Any:
    """``cyclone_ring()``, once per statement: NOTIFY ``cyclone_jobs_available`` if a
    worker waits for work (see the module's docstring).

    An uncorrelated subquery, so it runs once, where it is first needed: PostgreSQL
    folds repeats within a transaction, but each call reads the waiters.
    """
    return select(func.cyclone_ring()).scalar_subquery()


def when_available(state: Any) -> Any:
    """A ``RETURNING`` column of a statement that makes jobs available: ring for them.

    One call in the statement costs about 70 us less than the row trigger that did it
    before revision cyclone_0004.
    """
    return case((state == const(JobState.AVAILABLE.value), ring())).label("notified")


_FORGET_LAPSED = (
    delete(waiters)
    .where(waiters.c.waits_until < func.now() - literal_column("interval '1 minute'"))
    .returning(waiters.c.worker_id)
    .cte("forgotten")
)
_MARK = (
    insert(waiters)
    .values(
        worker_id=bindparam("me", type_=Text),
        waits_until=func.now() + bindparam("for", type_=Interval),
    )
    .on_conflict_do_update(
        index_elements=[waiters.c.worker_id],
        set_={"waits_until": insert(waiters).excluded.waits_until},
    )
    .add_cte(_FORGET_LAPSED)
)
_UNMARK = delete(waiters).where(waiters.c.worker_id == bindparam("me", type_=Text))

_slot = func.unnest(bindparam("slots", type_=ARRAY(Integer))).column_valued("slot")
_lock_key = const(RING_LOCK, Integer)
_UNSETTLED = select(_slot).where(
    case(
        (
            func.pg_try_advisory_lock(_lock_key, _slot),
            ~func.pg_advisory_unlock(_lock_key, _slot),
        ),
        else_=True,
    )
)
ALL_SLOTS = tuple(range(RING_SLOTS))


def mark_waiting(conn: Executor, worker_id: str, seconds: float) -> None:
    """Record ``worker_id`` as waiting for work for ``seconds`` (its own statement, which
    commits), forgetting the records of workers that lapsed a minute ago."""
    conn.affected(_MARK, {"me": worker_id, "for": timedelta(seconds=seconds)})


def unsettled(conn: Executor, slots: tuple[int, ...] = ALL_SLOTS) -> tuple[int, ...]:
    """The ring slots of ``slots`` held now: each by a transaction that may have read no
    waiter before this worker's record was committed, and has not ended yet."""
    return tuple(row[0] for row in conn.rows(_UNSETTLED, {"slots": list(slots)}))


def unmark(conn: Executor, worker_id: str) -> None:
    """Forget ``worker_id``'s record: it no longer waits for work."""
    conn.affected(_UNMARK, {"me": worker_id})


class Listener:
    """A daemon thread holding one autocommit connection that LISTENs on cyclone's channels."""

    def __init__(self, engine: Engine) -> None:
        # A weak reference: the registry's key must not be kept alive by its own value.
        self._engine = weakref.ref(engine)
        self._lock = threading.Lock()
        self._callbacks: dict[str, list[Callback]] = defaultdict(list)
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._listening_since: float | None = None
        self._recent: deque[tuple[str, float]] = deque()
        self._recent_set: Counter[str] = Counter()
        self._forgotten_upto = float("-inf")
        self._thread = threading.Thread(target=self._loop, name="cyclone-listener", daemon=True)
        self._thread.start()

    def subscribe(self, channel: str, callback: Callback) -> Callable[[], None]:
        """Call ``callback(payload)`` for each notification on ``channel``; returns unsubscribe."""
        with self._lock:
            self._callbacks[channel].append(callback)

        def unsubscribe() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._callbacks[channel].remove(callback)

        return unsubscribe

    def wait_ready(self, timeout: float) -> bool:
        """Wait until LISTEN is in force; False if it is not (callers then poll)."""
        return self._ready.wait(timeout)

    def stop(self, timeout: float | None = None) -> None:
        """Stop listening; with a ``timeout``, wait that long for the connection to close."""
        self._stopped.set()
        if timeout is not None and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _connect(self) -> psycopg.Connection[Any]:
        engine = self._engine()
        target = None if engine is None else session_engine(engine)
        if target is None:
            raise _EngineGone
        driver = detached(target)
        try:
            listen(driver, CHANNELS)
        except BaseException:
            with contextlib.suppress(psycopg.Error):
                driver.close()
            raise
        return driver

    def listening_since(self, moment: float) -> bool:
        """True if this listener has LISTENed without a break since ``moment`` (monotonic)."""
        since = self._listening_since
        return since is not None and since <= moment

    def finished_recently(self, payload: str) -> bool:
        """Whether a ``cyclone_run_finished`` with ``payload`` is among those remembered."""
        with self._lock:
            return payload in self._recent_set

    def surely_unfinished(self, payload: str, moment: float) -> bool:
        """True if no ``cyclone_run_finished`` with ``payload`` can have arrived since ``moment``.

        That holds when the listener has listened without a break since ``moment``, has
        not seen ``payload``, and has forgotten no payload that arrived since ``moment``
        (it remembers the last :data:`RECENT_FINISHED`).
        """
        with self._lock:
            return (
                self.listening_since(moment)
                and payload not in self._recent_set
                and self._forgotten_upto < moment
            )

    def _remember(self, payload: str) -> None:
        self._recent.append((payload, time.monotonic()))
        self._recent_set[payload] += 1
        while len(self._recent) > RECENT_FINISHED:
            forgotten, self._forgotten_upto = self._recent.popleft()
            self._recent_set[forgotten] -= 1
            if not self._recent_set[forgotten]:
                del self._recent_set[forgotten]

    def _dispatch(self, channel: str, payload: str) -> None:
        # Remember before taking the callbacks: a waiter that subscribes meanwhile either
        # is among them or, checking after it subscribed, finds the payload remembered.
        with self._lock:
            if channel == RUN_FINISHED and payload:
                self._remember(payload)
            callbacks = list(self._callbacks.get(channel, ()))
        for callback in callbacks:
            try:
                callback(payload)
            except Exception:
                log.exception("cyclone notification callback failed")

    def _wake_all(self) -> None:
        for channel in CHANNELS:
            self._dispatch(channel, "")

    @staticmethod
    def _ping(conn: psycopg.Connection[Any]) -> None:
        """A round trip that fails within :data:`PING_TIMEOUT` if the server is unreachable.

        A LISTEN connection only reads, so a network that drops packets without a reset
        would leave it waiting for notifications that never come; the ping finds that
        out and the loop reconnects (and waiters stop trusting what it has not heard).
        """
        with _deadline.interrupt_after(conn, PING_TIMEOUT):
            ping(conn)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopped.is_set()

    def _idle(self) -> bool:
        with self._lock:
            return not any(self._callbacks.values())

    def _loop(self) -> None:
        """Listen until stopped; a listener nobody uses ends when its connection fails."""
        while not self._stopped.is_set():
            try:
                conn = self._connect()
            except _EngineGone:
                break
            except Exception as exc:
                if self._idle():
                    break
                log.warning("cyclone listener cannot connect (%s); retrying", exc)
                self._stopped.wait(DEFAULT_RECONNECT_DELAY)
                continue
            self._listening_since = time.monotonic()
            self._ready.set()
            self._wake_all()
            try:
                quiet_since = time.monotonic()
                while not self._stopped.is_set() and self._engine() is not None:
                    for note in conn.notifies(timeout=1.0):
                        quiet_since = time.monotonic()
                        self._dispatch(note.channel, note.payload)
                    if time.monotonic() - quiet_since >= PING_INTERVAL:
                        self._ping(conn)
                        quiet_since = time.monotonic()
            except Exception as exc:
                self._listening_since = None
                self._ready.clear()
                if self._idle():
                    break
                log.warning("cyclone listener lost its connection (%s); reconnecting", exc)
                self._stopped.wait(DEFAULT_RECONNECT_DELAY)
            finally:
                self._listening_since = None
                with contextlib.suppress(psycopg.Error):
                    conn.close()
        self._stopped.set()


class Polling:
    """Stands in for the listener where nothing can LISTEN: never ready, so waiters poll."""

    alive = True

    def subscribe(self, channel: str, callback: Callback) -> Callable[[], None]:
        return lambda: None

    def wait_ready(self, timeout: float) -> bool:
        return False

    def surely_unfinished(self, payload: str, moment: float) -> bool:
        return False

    def stop(self, timeout: float | None = None) -> None:
        pass


class _EngineGone(Exception):
    """The listener's engine was garbage-collected: nothing is left to listen for."""


_listeners: weakref.WeakKeyDictionary[Engine, tuple[int, Listener | Polling]] = (
    weakref.WeakKeyDictionary()
)
_listeners_lock = threading.Lock()

STOP_TIMEOUT = 5.0


def close(engine: Engine) -> None:
    """Stop ``engine``'s listener in this process and wait until its connection is closed.

    Also called by ``engine.dispose()``.
    """
    with _listeners_lock:
        entry = _listeners.pop(engine, None)
    if entry is not None and entry[0] == os.getpid():
        entry[1].stop(STOP_TIMEOUT)


def listener(engine: Engine) -> Listener | Polling:
    """The listener of ``engine`` in this process, started on first use (or after it ended).

    An engine configured with no direct URL (``cyclone.configure(engine, listen_url=None)``)
    gets a :class:`Polling` stand-in.
    """
    with _listeners_lock:
        entry = _listeners.get(engine)
        if entry is None or entry[0] != os.getpid() or not entry[1].alive:
            on_dispose(engine, close)
            made = Listener(engine) if session_engine(engine) is not None else Polling()
            entry = (os.getpid(), made)
            _listeners[engine] = entry
        return entry[1]
