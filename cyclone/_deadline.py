"""Deadlines for reads that must not outlive their caller, and TCP keepalives.

A read on a network that stops delivering packets without a reset blocks until TCP
gives up, minutes later. :func:`call` runs a read on a helper thread and returns to the
caller by its deadline whatever the read is doing (waiting for the pool, connecting,
reading); a read left behind finishes or fails on its own and its result is dropped.
:func:`interrupt_after` shuts a connection's socket down at a deadline, so a read
blocked on it fails at once. :func:`keepalive` turns on the socket options that libpq's
``keepalives*`` and ``tcp_user_timeout`` parameters set, on connections cyclone opens
for itself, unless the connection string sets them.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg

T = TypeVar("T")

KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
USER_TIMEOUT_MS = 30_000
MIN_READ_WINDOW = 0.2
IDLE_NAME = "cyclone-read"

_LIBPQ_PARAMETERS = (
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def keepalive(driver: psycopg.Connection[Any]) -> None:
    """Detect a dead peer on ``driver``'s TCP socket within about 25 s idle or 30 s unacked.

    Keepalive probes find a peer gone while the connection is idle (a LISTEN);
    ``TCP_USER_TIMEOUT`` fails a connection whose sent data stays unacknowledged. A unix
    socket, or a connection string that sets any of libpq's keepalive parameters, is
    left as it is.
    """
    if any(name in driver.info.get_parameters() for name in _LIBPQ_PARAMETERS):
        return
    with contextlib.suppress(OSError), _socket_of(driver) as sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
            ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
        ):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


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
