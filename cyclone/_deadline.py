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
    __slots__ = ("done", "error", "fn", "name", "value")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.name = threading.current_thread().name
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class _Helper:
    """A daemon thread running one task at a time, returned to the idle list after each.

    While it runs a task it bears the name of the thread that asked for it, so that log
    records and statement counters attribute the read to its caller.
    """

    def __init__(self) -> None:
        self.tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=IDLE_NAME, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            task = self.tasks.get()
            self.thread.name = task.name
            try:
                task.value = task.fn()
            except BaseException as exc:
                task.error = exc
            self.thread.name = IDLE_NAME
            task.done.set()
            del task
            _release(self)


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


def _release(helper: _Helper) -> None:
    with _idle_lock:
        if _idle_pid == os.getpid():
            _idle.append(helper)


def call(fn: Callable[[], T], deadline: float | None) -> T:
    """``fn()``, or TimeoutError once ``deadline`` (monotonic) has passed while it runs.

    With no deadline ``fn`` runs on the calling thread. Otherwise it runs on a helper
    thread and gets at least :data:`MIN_READ_WINDOW` seconds, so that a wait whose time
    is up still reads once.
    """
    if deadline is None:
        return fn()
    task = _Task(fn)
    _take().tasks.put(task)
    if not task.done.wait(max(deadline - time.monotonic(), MIN_READ_WINDOW)):
        raise TimeoutError("the read did not finish by the deadline")
    if task.error is not None:
        raise task.error
    value: T = task.value
    return value
