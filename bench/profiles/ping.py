"""``bench.profile ping``: where one submit -> ``result()`` spends its time, across the
client and an idle worker in another process.

It traces the worker's hot path by wrapping cyclone's private methods (``Worker._execute``,
``_claim.record_and_claim``, ``_claim.record_jobs``, ``_notify.Listener._dispatch``, ...),
the one place the bench reaches past cyclone's public API: cyclone has no public hook that
marks these legs.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import cyclone
from bench import measure, workloads


class Timings:
    """Wall time spent inside chosen functions, per thread name."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()

    def wrap(self, owner: Any, name: str, label: str) -> Callable[[], None]:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                with self.lock:
                    self.total[label] += time.perf_counter() - t0
                    self.calls[label] += 1

        setattr(owner, name, timed)
        return lambda: setattr(owner, name, original)

    def report(self, wall: float, per: int, what: str) -> None:
        print(f"wall {wall:.3f} s for {per} {what}: {wall / per * 1e6:.0f} us each")
        for label, total in sorted(self.total.items(), key=lambda kv: -kv[1]):
            calls = self.calls[label]
            print(
                f"  {label:<48} {total:7.3f} s  {total / wall:6.1%} of wall  "
                f"{calls:6d} calls  {total / calls * 1e6:8.0f} us/call  "
                f"{total / per * 1e6:7.0f} us per {what[:-1]}"
            )


def profile_ping(engine: sa.Engine, tries: int) -> None:
    """Where the submit -> result() time goes, with an idle worker in another process.

    Prints the client's time per call and, from marks taken on entry to and exit from
    the functions on the path in both processes, the median of each leg of a ping.
    """
    import multiprocessing

    from cyclone._store import notify as _notify

    mp = multiprocessing.get_context("spawn")
    out: Any = mp.Queue()
    stop = mp.Event()
    p = mp.Process(target=traced_serve, args=(engine.url.render_as_string(False), 4, out, stop))
    p.start()
    try:
        out.get(timeout=60)
        time.sleep(1.0)
        for i in range(5):
            r, _created = workloads.ping.submit_once(engine, f"warm-{i}", i)
            assert r.result(timeout=30) == i
            time.sleep(0.05)
        timings = Timings()
        trace = Trace()
        undo = [
            timings.wrap(workloads.ping, "submit_once", "submit_once"),
            timings.wrap(cyclone.ResultRun, "result", "result()"),
        ]
        trace.wrap(workloads.ping, "submit_once", "submit")
        trace.wrap(cyclone.ResultRun, "result", "result")
        trace.wrap(cyclone.ResultRun, "_read_result", "read")
        trace.wrap(_notify.Listener, "_dispatch", "notify")
        samples = []
        try:
            for i in range(tries):
                t0 = time.perf_counter()
                r, _created = workloads.ping.submit_once(engine, f"ping-{i}", i)
                assert r.result(timeout=30) == i
                samples.append(time.perf_counter() - t0)
                time.sleep(0.05)
        finally:
            for u in reversed(undo):
                u()
        stop.set()
        kind, served = out.get(timeout=60)
        assert kind == "marks"
        timings.report(sum(samples), tries, "pings")
        print(
            f"  median {statistics.median(samples) * 1e3:.2f} ms, "
            f"p99 {measure.percentile([s * 1e3 for s in samples], 99):.2f} ms"
        )
        timeline(trace.marks, served)
        with engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT j.attempted_at - r.created_at, j.finalized_at - j.attempted_at, "
                "r.finalized_at - r.created_at FROM cyclone_runs r "
                "JOIN cyclone_jobs j ON j.run_id = r.id WHERE r.workflow = 'bench_ping' "
                "AND r.submit_key LIKE 'ping-%%'"
            ).all()
        claim = statistics.median(r[0].total_seconds() for r in rows) * 1e3
        run_ = statistics.median(r[1].total_seconds() for r in rows) * 1e3
        total = statistics.median(r[2].total_seconds() for r in rows) * 1e3
        print(
            f"  server clock, medians: created -> claimed {claim:.1f} ms, "
            f"claimed -> completed {run_:.1f} ms, run created -> finalized {total:.1f} ms"
        )
    finally:
        stop.set()
        p.join(timeout=15)
        if p.is_alive():
            p.terminate()
            p.join(timeout=15)


class Trace:
    """Timestamps (``time.monotonic()``, shared by the processes of one machine) taken on
    entry to and exit from chosen functions, to line up one ping across processes."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, float]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        marks = self.marks

        def traced(*args: Any, **kwargs: Any) -> Any:
            if label == "notify":
                marks.append((f"notify {args[1]}", time.monotonic()))
                return original(*args, **kwargs)
            marks.append((f"{label}>", time.monotonic()))
            try:
                return original(*args, **kwargs)
            finally:
                marks.append((f"{label}<", time.monotonic()))

        setattr(owner, name, traced)


def traced_serve(url: str, concurrency: int, out: Any, stop: Any) -> None:
    """An idle cyclone worker like :func:`bench.procs.cyclone_serve`, tracing its hot path;
    it sends its marks on ``out`` once ``stop`` is set."""
    from cyclone import worker
    from cyclone._store import claim as _claim

    trace = Trace()
    woken_by = "_on_notified" if hasattr(worker.Worker, "_on_notified") else "_on_jobs_available"
    trace.wrap(worker.Worker, woken_by, "jobs")
    trace.wrap(worker.Worker, "_take_outcomes", "loop")
    trace.wrap(_claim, "record_and_claim", "statement")
    if hasattr(_claim, "record_jobs"):  # the record that claims nothing
        trace.wrap(_claim, "record_jobs", "statement")
    trace.wrap(worker.Worker, "_execute", "step")
    engine = sa.create_engine(url, pool_size=concurrency + 2, max_overflow=8)
    w = cyclone.Worker(engine, workflows=[workloads.ping], concurrency=concurrency)
    with engine.connect() as conn:
        conn.execute(sa.select(1))
    out.put(("ready", None))

    def stopper() -> None:
        stop.wait()
        w.stop()

    threading.Thread(target=stopper, daemon=True).start()
    w.run()
    out.put(("marks", trace.marks))
    engine.dispose()


PING_LEGS = (
    ("C submit>", -1),
    ("W jobs>", 0),
    ("C submit<", 0),
    ("W loop>", 1),
    ("W statement>", 3),
    ("W statement<", 4),
    ("W step>", 5),
    ("W step<", 6),
    ("W loop>", 6),
    ("W statement>", 8),
    ("W statement<", 9),
    ("C notify cyclone_run_finished", 9),
    ("C read>", 11),
    ("C read<", 12),
    ("C result<", 13),
)
"""The marks of one ping, each with the mark it is looked for after (and timed from)."""


def timeline(client: list[tuple[str, float]], served: list[tuple[str, float]]) -> None:
    """Print the median time of each leg of the pings, from the marks of both processes."""
    marks = sorted([(t, "C " + m) for m, t in client] + [(t, "W " + m) for m, t in served])
    starts = [i for i, (_t, m) in enumerate(marks) if m == "C submit>"]
    legs: dict[int, list[float]] = defaultdict(list)
    totals: list[float] = []
    slow: list[tuple[float, list[tuple[float, str]]]] = []
    for n, first in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(marks)
        found: list[int] = []
        for label, after in PING_LEGS:
            start = first if after < 0 else found[after] + 1
            hit = next((i for i in range(start, end) if marks[i][1] == label), None)
            if hit is None:
                break
            found.append(hit)
        if len(found) != len(PING_LEGS):
            continue
        totals.append((marks[found[-1]][0] - marks[first][0]) * 1e3)
        slow.append((totals[-1], [marks[i] for i in found]))
        for leg, (_label, after) in enumerate(PING_LEGS[1:], 1):
            legs[leg].append((marks[found[leg]][0] - marks[found[after]][0]) * 1e3)
    print(f"  timeline of {len(totals)} pings, medians (ms; C client, W worker process):")
    for leg, (label, after) in enumerate(PING_LEGS[1:], 1):
        if legs[leg]:
            print(f"    {statistics.median(legs[leg]):7.3f}  {PING_LEGS[after][0]} -> {label}")
    if totals:
        print(f"    {statistics.median(totals):7.3f}  total")
    for total, path in sorted(slow, key=lambda ping: -ping[0])[:3]:
        at = ", ".join(f"{m} {(t - path[0][0]) * 1e3:.2f}" for t, m in path[1:])
        print(f"  a slow ping, {total:.2f} ms (ms after submit>): {at}")
