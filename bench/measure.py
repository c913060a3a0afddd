"""How the bench times things: calls in turns, spawned processes released at once, and
the CPU the machine and the server spent meanwhile.

Times within a process are ``time.perf_counter()``; across processes ``time.monotonic()``,
which all processes of one machine share.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

TURNS = 20
"""Turns of :func:`interleaved`: each side's calls are split into this many runs."""
WARMUP = 20
"""Untimed calls each side makes before its timed ones."""


def interleaved(
    sides: dict[str, tuple[Callable[[int], None], int]], turns: int = TURNS
) -> dict[str, float]:
    """Calls per second of each side, its ``n`` calls run in turns of ``n / turns``.

    Taking turns spreads the VM's drifting commit latency over every side alike, where
    one block after another would hand each side a different stretch of it. Each side
    first makes ``WARMUP`` untimed calls (indexes from ``n`` up).
    """
    for fn, n in sides.values():
        for i in range(n, n + WARMUP):
            fn(i)

    def calls(fn: Callable[[int], None]) -> Callable[[range], None]:
        def run(idx: range) -> None:
            for i in idx:
                fn(i)

        return run

    spent = turn_times({name: (calls(fn), n) for name, (fn, n) in sides.items()}, turns)
    return {name: n / spent[name] for name, (_fn, n) in sides.items()}


def turn_times(
    sides: dict[str, tuple[Callable[[range], None], int]], turns: int = TURNS
) -> dict[str, float]:
    """Seconds each side spent on its indexes ``0..n-1``, given in ``turns`` alternating
    ranges (each side's function makes the calls of one range)."""
    spent = dict.fromkeys(sides, 0.0)
    for turn in range(turns):
        for name, (fn, n) in sides.items():
            idx = range(n * turn // turns, n * (turn + 1) // turns)
            t0 = time.perf_counter()
            fn(idx)
            spent[name] += time.perf_counter() - t0
    return spent


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile of ``values``, interpolated between the two nearest ranks."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def expect(done: int, wanted: int, what: str) -> None:
    """Warn (the figure is still reported) when a drain ran another number of jobs."""
    if done != wanted:
        print(f"  warning: {what} ran {done} jobs, expected {wanted}", file=sys.stderr)


# --- processes -------------------------------------------------------------------------------


def ready(out: Any, count: int, timeout: float = 120) -> list[Any]:
    """Wait for ``count`` ``("ready", payload)`` messages on ``out``; their payloads."""
    got = []
    for _ in range(count):
        kind, payload = out.get(timeout=timeout)
        assert kind == "ready", kind
        got.append(payload)
    return got


def stop(processes: Iterable[Any], timeout: float = 30, *, terminate: bool = False) -> None:
    """Join each process (SIGTERM first if ``terminate``), killing what does not end."""
    processes = list(processes)
    if terminate:
        for p in processes:
            if p.pid is not None and p.is_alive():
                p.terminate()
    for p in processes:
        if p.pid is None:
            continue
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join()


class Timed(NamedTuple):
    """What :func:`spawn_timed` measured: the processes' aggregate and where the CPU went."""

    rate: float
    total: int
    client_cpu: float
    """CPU seconds the processes spent in their timed loops (their own reports)."""
    server_cpu: float | None
    """CPU seconds of the server's processes meanwhile; None when they cannot be read."""
    busy: float | None
    """The machine's CPU in use meanwhile, as a fraction of all its cores."""

    def cpu_per_call(self) -> dict[str, float | None]:
        """Microseconds of CPU per call, the processes' and the server's, and ``busy``."""
        server = None if self.server_cpu is None else self.server_cpu / self.total * 1e6
        return {
            "client_us": self.client_cpu / self.total * 1e6,
            "server_us": server,
            "busy": self.busy,
        }

    def describe(self, unit: str) -> str:
        """One line: the rate, then where each call's CPU went and how busy the machine was."""
        cpu = self.cpu_per_call()
        server = "n/a" if cpu["server_us"] is None else f"{cpu['server_us']:.0f} us"
        busy = "" if self.busy is None else f"; machine {self.busy:.0%} busy"
        return (
            f"{self.rate:,.0f} {unit}/s; CPU per call: processes {cpu['client_us']:.0f} us, "
            f"server {server}{busy}"
        )


def spawn_timed(mp: Any, target: Any, arglist: list[tuple[Any, ...]]) -> Timed:
    """Start one process per argument tuple (``mp``: a multiprocessing context), release them
    at once; what they did and what it cost.

    Each ``target`` takes its arguments then ``start``, ``finish`` (set once all reported,
    so that connections can stay open until the CPU is read) and ``out``, and reports
    ``("ready", None)`` then ``("done", (t0, t1, count[, cpu seconds]))``.
    """
    start = mp.Event()
    finish = mp.Event()
    out: Any = mp.Queue()
    ps = [mp.Process(target=target, args=(*args, start, finish, out)) for args in arglist]
    for p in ps:
        p.start()
    try:
        ready(out, len(ps))
        server0, (busy0, all0) = server_cpu(), machine_cpu()
        start.set()
        results = [out.get(timeout=1200)[1] for _ in ps]
        server1, (busy1, all1) = server_cpu(), machine_cpu()
    finally:
        finish.set()
        stop(ps)
    t0 = min(res[0] for res in results)
    t1 = max(res[1] for res in results)
    total = sum(res[2] for res in results)
    client = sum(res[3] for res in results if len(res) > 3)
    server = None if server0 is None or server1 is None else server1 - server0
    busy = (busy1 - busy0) / (all1 - all0) if all1 > all0 else None
    return Timed(total / (t1 - t0), total, client, server, busy)


# --- /proc -----------------------------------------------------------------------------------


def server_cpu() -> float | None:
    """CPU seconds used so far by this host's ``postgres`` processes (None if unreadable).

    Backends that ended meanwhile are not counted: the timed processes keep theirs open.
    """
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    seen = False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        if name != "postgres" and not name.startswith("postgres:"):
            continue
        seen = True
        fields = text[text.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick if seen else None


def machine_cpu() -> tuple[float, float]:
    """(busy, all) CPU seconds of this machine so far, from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / tick, sum(values) / tick


def rss_mb() -> float:
    """This process's resident set size in MB (from /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6
