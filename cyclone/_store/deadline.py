"""Deadlines for reads that must not outlive their caller, and TCP keepalives.

A read on a network that stops delivering packets without a reset blocks until TCP
gives up, minutes later. :func:`call` runs a read on a helper thread and returns to the
caller by its deadline whatever the read is doing (waiting for the pool, connecting,
reading); a read left behind finishes or fails on its own and its result is dropped.
:func:`interrupt_after` shuts a connection's socket down at a deadline, so a read
blocked on it fails at once. The connections cyclone opens for itself (a worker's held,
heartbeat and leader connections, the LISTEN connection) are opened inside
:func:`opening`, on an engine prepared by :func:`keepalives_for`: libpq's ``keepalives*``
and ``tcp_user_timeout`` connection parameters (:data:`KEEPALIVES`) are added to theirs,
unless their connection string sets any of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Engine, event

T = TypeVar("T")

KEEPALIVES: Mapping[str, str] = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",
}
"""libpq's parameters for cyclone's own connections: a dead peer is found within about
25 s idle (first probe after 10 s, then every 5 s, 3 lost) or 30 s of data unacknowledged."""

MIN_READ_WINDOW = 0.2
IDLE_NAME = "cyclone-read"
MAX_IDLE = 1
"""Helper threads kept idle for the next read with a deadline; others end after theirs."""

_opening: contextvars.ContextVar[bool] = contextvars.ContextVar("cyclone_opening", default=False)


def keepalive_params(given: Mapping[str, Any], conninfo: str = "") -> dict[str, str]:
    """The parameters of :data:`KEEPALIVES` to add to a connection's ``given`` ones (and
    its ``conninfo`` string): none when either sets any of them, so that a URL's choice
    stands; ``tcp_user_timeout`` only on a libpq that knows it (12 or later)."""
    named = set(given)
    if conninfo:
        named |= set(psycopg.conninfo.conninfo_to_dict(conninfo))
    if named & set(KEEPALIVES):
        return {}
    params = dict(KEEPALIVES)
    if psycopg.pq.version() < 120000:
        del params["tcp_user_timeout"]
    return params


def _add_keepalives(
    dialect: Any, record: Any, cargs: Sequence[Any], cparams: MutableMapping[str, Any]
) -> None:
    """``do_connect``: inside :func:`opening`, add :data:`KEEPALIVES` to the parameters."""
    if _opening.get():
        conninfo = cargs[0] if cargs and isinstance(cargs[0], str) else ""
        cparams.update(keepalive_params(cparams, str(cparams.get("conninfo", conninfo))))


def keepalives_for(engine: Engine) -> None:
    """Make the connections :func:`opening` opens through ``engine``'s connect function
    (also a copy of its pool, ``engine.pool.recreate()``) carry :data:`KEEPALIVES`.

    An engine made with a ``creator`` of its own opens its connections as that says:
    put the parameters in its connection string.
    """
    if not event.contains(engine, "do_connect", _add_keepalives):
        event.listen(engine, "do_connect", _add_keepalives)


@contextlib.contextmanager
def opening() -> Iterator[None]:
    """Connections opened in this block (on this thread) are cyclone's own: they get
    :data:`KEEPALIVES` on engines prepared by :func:`keepalives_for`."""
    token = _opening.set(True)
    try:
        yield
    finally:
        _opening.reset(token)


@contextlib.contextmanager
def _socket_of(driver: psycopg.Connection[Any]) -> Iterator[socket.socket]:
    """A socket on a duplicate of ``driver``'s descriptor (closing it leaves the original)."""
    sock = socket.socket(fileno=os.dup(driver.fileno()))
    try:
        yield sock
    finally:
        sock.close()


def shutdown(driver: psycopg.Connection[Any]) -> None:
    """Shut ``driver``'s socket down: a read blocked on it fails now, the connection is broken."""
    with contextlib.suppress(OSError, psycopg.Error), _socket_of(driver) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def driver_of(conn: Any) -> psycopg.Connection[Any] | None:
    """The psycopg connection under a SQLAlchemy ``Connection``, one detached from its pool
    too (whose ``driver_connection`` is None); None when it has none open."""
    fairy = conn.connection
    for each in (fairy.driver_connection, fairy.dbapi_connection):
        if isinstance(each, psycopg.Connection):
            return each
    return None


@contextlib.contextmanager
def interrupt_after(driver: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Shut ``driver``'s socket down if the block has not ended within ``seconds``."""
    timer = threading.Timer(seconds, shutdown, (driver,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class _Task:
    """One read handed to a helper, and the connections it has checked out meanwhile.

    At its deadline the caller interrupts it: the sockets of those connections are shut
    down, so the read blocked on one fails at once and its helper thread ends. A
    connection is forgotten when it goes back to its pool, so an interrupt never touches
    a connection the task no longer holds.
    """

    __slots__ = ("done", "drivers", "error", "fn", "interrupted", "lock", "name", "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.name = threading.current_thread().name
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.drivers: list[Any] = []
        self.interrupted = False

    def checked_out(self, driver: Any) -> None:
        with self.lock:
            if self.interrupted:
                shutdown(driver)
            else:
                self.drivers.append(driver)

    def checked_in(self, driver: Any) -> None:
        with self.lock, contextlib.suppress(ValueError):
            self.drivers.remove(driver)

    def finished(self) -> None:
        """Forget the connections: an interrupt that comes after the read touches none."""
        with self.lock:
            self.drivers.clear()

    def interrupt(self) -> None:
        with self.lock:
            self.interrupted = True
            for driver in self.drivers:
                shutdown(driver)


_running = threading.local()
"""On a helper thread running a task: ``task``, and ``deadline`` (monotonic) it ends by."""


def _current() -> _Task | None:
    task: _Task | None = getattr(_running, "task", None)
    return task


def _on_checkout(driver: Any, record: Any, proxy: Any) -> None:
    task = _current()
    if task is not None and isinstance(driver, psycopg.Connection):
        task.checked_out(driver)


def _on_checkin(driver: Any, record: Any) -> None:
    task = _current()
    if task is not None and driver is not None:
        task.checked_in(driver)


def _on_connect(dialect: Any, record: Any, cargs: Any, cparams: MutableMapping[str, Any]) -> None:
    """A connection opened by a task gives up connecting by the task's deadline (libpq's
    ``connect_timeout``, at least its minimum of 2 s), unless its URL says otherwise."""
    task = _current()
    deadline = getattr(_running, "deadline", None)
    if task is not None and deadline is not None and "connect_timeout" not in cparams:
        cparams["connect_timeout"] = max(2, math.ceil(deadline - time.monotonic()))


def interruptible(engine: Engine) -> None:
    """Let :func:`call` interrupt reads on ``engine``'s connections at their deadline."""
    for name, fn in (
        ("checkout", _on_checkout),
        ("checkin", _on_checkin),
        ("do_connect", _on_connect),
    ):
        if not event.contains(engine, name, fn):
            event.listen(engine, name, fn)


class _Helper:
    """A daemon thread running one task at a time.

    While it runs a task it bears the name of the thread that asked for it, so that log
    records and statement counters attribute the read to its caller. After a task it
    waits for the next one if no other helper is idle, and ends otherwise: at most
    :data:`MAX_IDLE` helpers outlive the calls they served.
    """

    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue[tuple[_Task, float | None]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=IDLE_NAME, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            task, deadline = self.tasks.get()
            self.thread.name = task.name
            _running.task, _running.deadline = task, deadline
            try:
                task.value = task.fn()
            except BaseException as exc:
                task.error = exc
            _running.task = _running.deadline = None
            task.finished()
            self.thread.name = IDLE_NAME
            task.done.set()
            del task
            if not _release(self):
                return


_idle: list[_Helper] = []
_idle_pid = os.getpid()
_idle_lock = threading.Lock()


def _take() -> _Helper:
    global _idle_pid
    with _idle_lock:
        if _idle_pid != os.getpid():
            _idle.clear()
            _idle_pid = os.getpid()
        if _idle:
            return _idle.pop()
    return _Helper()


def _release(helper: _Helper) -> bool:
    """Keep ``helper`` for the next call if fewer than :data:`MAX_IDLE` are idle."""
    with _idle_lock:
        if _idle_pid == os.getpid() and len(_idle) < MAX_IDLE:
            _idle.append(helper)
            return True
    return False


def call(fn: Callable[[], T], deadline: float | None) -> T:
    """``fn()``, or TimeoutError once ``deadline`` (monotonic) has passed while it runs.

    With no deadline ``fn`` runs on the calling thread. Otherwise it runs on a helper
    thread and gets at least :data:`MIN_READ_WINDOW` seconds, so that a wait whose time
    is up still reads once. At the deadline the read is interrupted (on an engine made
    :func:`interruptible`): the connections it holds are shut down and a connection it
    is opening gives up by then, so its thread ends with the call, not when TCP would
    give up, minutes later (or never, on a network that still acknowledges).
    """
    if deadline is None:
        return fn()
    task = _Task(fn)
    window = max(deadline - time.monotonic(), MIN_READ_WINDOW)
    _take().tasks.put((task, time.monotonic() + window))
    if not task.done.wait(window):
        task.interrupt()
        raise TimeoutError("the read did not finish by the deadline")
    if task.error is not None:
        raise task.error
    value: T = task.value
    return value
