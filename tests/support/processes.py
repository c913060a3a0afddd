"""The subprocesses tests start: default signal dispositions, a process group of their own,
and stopped when the test ends, passed or failed.

A suite started as a background job (``scripts/test &``, nohup, a non-interactive shell)
runs with SIGINT (or SIGHUP) ignored, and an ignored signal stays ignored across ``exec``:
a ``cyclone dashboard`` a test interrupts with SIGINT would then never stop. Every child
started here begins with every signal at its default disposition and none blocked,
whatever the caller ignored, in a process group of its own, so that :func:`stop` kills it
with everything it started. :func:`stop_started` (an autouse fixture of tests/conftest.py)
stops what a test left running; children started before :func:`begin_test` (by a module
or session fixture, before the test's own fixtures) are left to the fixture that started
them.

Use :func:`popen` and :func:`run` in place of ``subprocess.Popen`` and ``subprocess.run``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Any

_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def default_signals() -> None:
    """In the child, before ``exec``: every signal to its default disposition, none blocked."""
    for sig in signal.valid_signals():
        if sig in _UNCATCHABLE:
            continue
        with contextlib.suppress(OSError, ValueError):  # the C library's reserved ones
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


class Process(subprocess.Popen[Any]):
    """A ``Popen`` whose ``with`` block kills its process group when the block raises.

    (``Popen.__exit__`` alone waits for the child, so a failing test would hang on a
    server that never exits.)
    """

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            stop(self)
        super().__exit__(exc_type, exc, tb)


_started: list[Process] = []


def popen(args: Sequence[str | os.PathLike[str]], **kwargs: Any) -> Process:
    """``subprocess.Popen(args, **kwargs)`` with default signals, in its own process group."""
    kwargs.setdefault("preexec_fn", default_signals)
    kwargs.setdefault("process_group", 0)
    proc = Process(args, **kwargs)
    _started.append(proc)
    return proc


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    input: str | bytes | None = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` through :func:`popen`: on a timeout or an error the whole process
    group is killed, not only the child."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = subprocess.PIPE
        kwargs["stderr"] = subprocess.PIPE
    with popen(args, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except BaseException:
            stop(proc)
            raise
        finally:
            _forget(proc)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def stop(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """Kill ``proc``'s process group (SIGKILL) if the child still runs, and reap the child."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()  # in case it left its group
    with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
        proc.communicate(timeout=timeout)


def _forget(proc: Process) -> None:
    with contextlib.suppress(ValueError):
        _started.remove(proc)


def begin_test() -> None:
    """Leave the children started so far (by wider-scoped fixtures) out of :func:`stop_started`."""
    _started.clear()


def stop_started() -> list[list[str]]:
    """Stop every child started since :func:`begin_test` that still runs; their command lines."""
    left = [proc for proc in _started if proc.poll() is None]
    for proc in left:
        stop(proc)
    for proc in _started:  # reap and close the pipes of those already exited too
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError, OSError):
            proc.communicate(timeout=5)
    _started.clear()
    return [[str(arg) for arg in proc.args] for proc in left]
