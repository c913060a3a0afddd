"""Figures of many processes at once (g, h, i), of a worker's memory (j), and figure a
through PgBouncer (k). Each runs once, after the rounds; the process entry points are
module-level so that spawned processes can import them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing.synchronize
import os
import queue
import threading
import time
from multiprocessing import Queue
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
import sqlalchemy as sa

import cyclone
from bench import bouncer, procs, workloads

if TYPE_CHECKING:
    from bench.run import Bench

SUBMITTERS = 8
WORKER_COUNTS = (1, 2, 4)
MIXED_SUBMITTERS = 4
MIXED_WORKERS = 2
MIXED_ANALYZE_EVERY = 10.0
"""Seconds between figure i's ANALYZEs of its growing tables, as autovacuum would run them
(it is off on the bench server): a worker's generic plans made on the empty tables would
otherwise read whole tables for the rest of the run."""


def rss_mb() -> float:
    """This process's resident set size in MB (from /proc/self/statm)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


# --- process entry points ------------------------------------------------------------------


def submitter(
    url: str,
    dsn: str,
    side: str,
    prefix: str,
    count: int,
    start: multiprocessing.synchronize.Event,
    finish: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """``count`` new-key submits as fast as it can: ``side`` "cyclone" (``submit_once``),
    "raw" (the raw insert) or "raw-notify" (the raw insert with cyclone's NOTIFY).

    Its connections stay open until ``finish``, so that their backends' CPU can be read.
    """
    engine = sa.create_engine(url, pool_size=2)
    conn = psycopg.connect(dsn, autocommit=True)
    wf = workloads.one_step
    if side.startswith("raw"):
        statement = (
            workloads.RAW_INSERT_ONCE_NOTIFY if side == "raw-notify" else workloads.RAW_INSERT_ONCE
        )

        def one(i: int) -> None:
            conn.execute(
                statement, ("bench_one", f"{prefix}-{i}", json.dumps(workloads.payload(i)))
            ).fetchone()
    else:

        def one(i: int) -> None:
            wf.submit_once(engine, f"{prefix}-{i}", workloads.payload(i))

    for i in range(20):
        one(-1 - i)
    out.put(("ready", None))
    start.wait()
    t0, cpu0 = time.monotonic(), time.process_time()
    for i in range(count):
        one(i)
    t1, cpu1 = time.monotonic(), time.process_time()
    out.put(("done", (t0, t1, count, cpu1 - cpu0)))
    finish.wait(60)
    conn.close()
    engine.dispose()


def paced_submitter(
    url: str,
    prefix: str,
    rate: float,
    seconds: float,
    start: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """New-key ``submit_once`` calls at ``rate`` per second for ``seconds`` (fewer if it lags)."""
    engine = sa.create_engine(url, pool_size=2)
    wf = workloads.one_step
    with engine.connect() as conn:
        conn.execute(sa.select(1))
    out.put(("ready", None))
    start.wait()
    t0 = time.monotonic()
    n = 0
    while True:
        now = time.monotonic()
        if now - t0 >= seconds:
            break
        due = t0 + n / rate
        if due > now:
            time.sleep(due - now)
        wf.submit_once(engine, f"{prefix}-{n}", workloads.payload(n))
        n += 1
    out.put(("done", (t0, time.monotonic(), n)))
    engine.dispose()


def serving_worker(
    url: str,
    concurrency: int,
    start: multiprocessing.synchronize.Event,
    stop: multiprocessing.synchronize.Event,
    out: Queue[Any],
) -> None:
    """A ``Worker.run()`` of the 1-step workflow until ``stop`` is set."""
    engine = sa.create_engine(url, pool_size=concurrency + 2)
    worker = cyclone.Worker(
        engine, workflows=[workloads.one_step], concurrency=concurrency, sweep=False
    )
    out.put(("ready", None))
    start.wait()

    def stopper() -> None:
        stop.wait()
        worker.stop()

    threading.Thread(target=stopper, daemon=True).start()
    worker.run()
    out.put(("done", None))
    engine.dispose()


def memory_worker(url: str, concurrency: int, commands: Queue[Any], out: Queue[Any]) -> None:
    """One Worker that drains on each command and reports its RSS after each drain."""
    quiet = logging.getLogger("cyclone")
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    engine = sa.create_engine(url, pool_size=concurrency + 2)
    worker = cyclone.Worker(
        engine, steps=[workloads.noop, workloads.fail], concurrency=concurrency, sweep=False
    )
    out.put(("ready", rss_mb()))
    while commands.get() == "drain":
        n = worker.drain()
        out.put(("rss", (n, rss_mb())))
    engine.dispose()


# --- figures -------------------------------------------------------------------------------


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


def spawn_timed(mp: Any, target: Any, arglist: list[tuple[Any, ...]]) -> Timed:
    """Start one process per argument tuple (``mp``: a multiprocessing context), release them
    at once; what they did and what it cost."""
    start = mp.Event()
    finish = mp.Event()
    out: Any = mp.Queue()
    ps = [mp.Process(target=target, args=(*args, start, finish, out)) for args in arglist]
    for p in ps:
        p.start()
    try:
        for _ in ps:
            kind, _payload = out.get(timeout=120)
            assert kind == "ready"
        server0, (busy0, all0) = server_cpu(), machine_cpu()
        start.set()
        results = [out.get(timeout=1200)[1] for _ in ps]
        server1, (busy1, all1) = server_cpu(), machine_cpu()
    finally:
        finish.set()
        for p in ps:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()
    t0 = min(res[0] for res in results)
    t1 = max(res[1] for res in results)
    total = sum(res[2] for res in results)
    client = sum(res[3] for res in results if len(res) > 3)
    server = None if server0 is None or server1 is None else server1 - server0
    busy = (busy1 - busy0) / (all1 - all0) if all1 > all0 else None
    return Timed(total / (t1 - t0), total, client, server, busy)


def fig_g(bench: Bench) -> None:
    """Aggregate new-key submits from 8 processes, cyclone and raw, in alternating turns."""
    per_proc = bench.sizes.new_keys // SUBMITTERS * 2
    f = bench.fig(
        "g",
        f"submit_once new key, {SUBMITTERS} processes",
        "submits/s",
        True,
        goal=0.85,
        goal_text=">= 0.85x raw",
        raw_label=f"raw psycopg, {SUBMITTERS} processes",
    )
    cpu: dict[str, list[dict[str, float | None]]] = {"raw": [], "cyclone": []}
    for turn in range(2):
        for side in ("raw", "cyclone"):
            args = [
                (bench.sa_url, bench.dsn, side, f"g-{side}-{turn}-{p}", per_proc)
                for p in range(SUBMITTERS)
            ]
            timed = spawn_timed(bench.mp, submitter, args)
            (f.raw if side == "raw" else f.cyclone).append(timed.rate)
            # Where each submit's CPU went, and how much of the machine was busy: all of it
            # means the cores, not waits, set the rate.
            cpu[side].append(timed.cpu_per_call())
            print(f"  g turn {turn} {side}: {timed.describe('submits')}", flush=True)
    f.extra["cpu_per_submit"] = cpu


def fig_h(bench: Bench) -> None:
    """Worker throughput with 1, 2 and 4 processes on a backlog of no-op jobs."""
    n = bench.sizes.backlog
    for nproc in WORKER_COUNTS:
        f = bench.fig(
            f"h-{nproc}p",
            f"worker, {n:,} no-op jobs backlog, {nproc} proc",
            "jobs/s",
            True,
            raw_label="raw SKIP LOCKED, 10/claim",
        )
        bench.reset()
        bench.sql(
            "INSERT INTO raw_jobs (kind, args) "
            "SELECT 'noop', to_jsonb(g) FROM generate_series(1, %(n)s) g",
            n=n,
        )
        bench.analyze()
        rate, done = bench._spawn_drain(procs.raw_drain, (bench.dsn, 10), nproc)
        bench._expect(done, n, "raw drain")
        f.raw.append(rate)
        bench.sql(
            "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
            "SELECT 'bench.noop', 'default', 0, 'available', to_jsonb(g), 3 "
            "FROM generate_series(1, %(n)s) g",
            n=n,
        )
        bench.analyze()
        rate, done = bench._spawn_drain(
            procs.cyclone_drain, (bench.sa_url, "jobs", bench.concurrency), nproc
        )
        bench._expect(done, n, "cyclone jobs drain")
        f.cyclone.append(rate)
        print(f"  h {nproc} proc: cyclone {f.cyclone[-1]:,.0f}, raw {f.raw[-1]:,.0f} jobs/s")


def fig_i(bench: Bench) -> None:
    """Submitters and workers together: submits/s, steps/s, p50/p99 submit -> finished."""
    seconds = bench.sizes.mixed_seconds
    rate = bench.sizes.mixed_rate
    label = f"{MIXED_SUBMITTERS} submitters at {rate:,.0f}/s total + {MIXED_WORKERS} workers"
    subs = bench.fig("i-submits", f"mixed {seconds:g} s: submits", "submits/s", True, raw_label="")
    steps = bench.fig("i-steps", f"mixed {seconds:g} s: steps", "steps/s", True, raw_label="")
    p50 = bench.fig("i-p50", "mixed: submit -> finished, median", "ms", False, raw_label="")
    p99 = bench.fig("i-p99", "mixed: submit -> finished, p99", "ms", False, raw_label="")
    for f in (subs, steps, p50, p99):
        f.extra["setup"] = label
    bench.reset()
    start = bench.mp.Event()
    stop = bench.mp.Event()
    wout: Any = bench.mp.Queue()
    workers = [
        bench.mp.Process(
            target=serving_worker, args=(bench.sa_url, bench.concurrency, start, stop, wout)
        )
        for _ in range(MIXED_WORKERS)
    ]
    sout: Any = bench.mp.Queue()
    submitters = [
        bench.mp.Process(
            target=paced_submitter,
            args=(bench.sa_url, f"i-{p}", rate / MIXED_SUBMITTERS, seconds, start, sout),
        )
        for p in range(MIXED_SUBMITTERS)
    ]
    for p in (*workers, *submitters):
        p.start()
    try:
        for _ in workers:
            assert wout.get(timeout=120)[0] == "ready"
        for _ in submitters:
            assert sout.get(timeout=120)[0] == "ready"
        start.set()
        analyzed = time.monotonic()

        def autovacuum() -> None:
            nonlocal analyzed
            if time.monotonic() - analyzed >= MIXED_ANALYZE_EVERY:
                bench.analyze()
                analyzed = time.monotonic()

        results: list[Any] = []
        deadline = time.monotonic() + seconds + 600
        while len(results) < len(submitters):
            if time.monotonic() > deadline:
                raise TimeoutError("figure i: the submitters did not report")
            with contextlib.suppress(queue.Empty):
                results.append(sout.get(timeout=1.0)[1])
            autovacuum()
        total = sum(res[2] for res in results)
        deadline = time.monotonic() + 600
        with bench.raw_conn() as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM cyclone_runs WHERE finalized_at IS NULL"
                ).fetchone()
                if row is not None and row[0] == 0:
                    break
                time.sleep(0.5)
                autovacuum()
    finally:
        stop.set()
        for p in (*workers, *submitters):
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
                p.join()
    t0 = min(res[0] for res in results)
    t1 = max(res[1] for res in results)
    subs.cyclone.append(total / (t1 - t0))
    with bench.raw_conn() as conn:
        row = conn.execute(
            """
            WITH w AS (SELECT min(created_at) AS lo, max(created_at) AS hi FROM cyclone_runs)
            SELECT
                (SELECT count(*) FROM cyclone_jobs, w WHERE finalized_at BETWEEN w.lo AND w.hi)
                    / extract(epoch FROM (SELECT hi - lo FROM w)),
                percentile_cont(0.5) WITHIN GROUP (
                    ORDER BY extract(epoch FROM finalized_at - created_at)),
                percentile_cont(0.99) WITHIN GROUP (
                    ORDER BY extract(epoch FROM finalized_at - created_at)),
                count(*) FILTER (WHERE finalized_at IS NULL),
                count(*) FILTER (WHERE state <> 'completed')
            FROM cyclone_runs
            """
        ).fetchone()
    assert row is not None
    steps.cyclone.append(float(row[0]))
    p50.cyclone.append(float(row[1]) * 1000)
    p99.cyclone.append(float(row[2]) * 1000)
    subs.extra["runs"] = total
    subs.extra["unfinished"] = int(row[3])
    subs.extra["not_completed"] = int(row[4])
    print(
        f"  i: {subs.cyclone[-1]:,.0f} submits/s, {steps.cyclone[-1]:,.0f} steps/s, "
        f"p50 {p50.cyclone[-1]:.1f} ms, p99 {p99.cyclone[-1]:.1f} ms ({total:,} runs)"
    )


def fig_j(bench: Bench) -> None:
    """A worker's RSS after 10k no-op jobs, after 100k, and after 10k failing ones more."""
    n = bench.sizes.memory_jobs
    first = bench.fig("j-10k", f"worker RSS after {n:,} no-op jobs", "MB", False, raw_label="")
    many = bench.fig(
        "j-100k",
        f"worker RSS after {10 * n:,} no-op jobs",
        "MB",
        False,
        goal=1.1,
        goal_text=f"<= 1.1x RSS after {n:,}",
        raw_label="",
    )
    failing = bench.fig(
        "j-fail",
        f"  + {n:,} failing jobs",
        "MB",
        False,
        goal=1.1,
        goal_text=f"<= 1.1x RSS after {n:,}",
        raw_label="",
    )
    many.goal_base = failing.goal_base = first.cyclone
    bench.reset()
    commands: Any = bench.mp.Queue()
    out: Any = bench.mp.Queue()
    proc = bench.mp.Process(
        target=memory_worker, args=(bench.sa_url, bench.concurrency, commands, out)
    )
    proc.start()

    def drain(kind: str, attempts: int) -> tuple[int, float]:
        bench.sql(
            "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
            "SELECT %(kind)s, 'default', 0, 'available', to_jsonb(g), %(attempts)s "
            "FROM generate_series(1, %(n)s) g",
            kind=kind,
            attempts=attempts,
            n=n,
        )
        bench.analyze()
        commands.put("drain")
        kind_, (done, rss) = out.get(timeout=1200)
        assert kind_ == "rss"
        bench.sql("TRUNCATE cyclone_signals, cyclone_jobs, cyclone_runs")
        return int(done), float(rss)

    try:
        kind, start_rss = out.get(timeout=120)
        assert kind == "ready"
        first.extra["rss_at_start"] = start_rss
        _done, rss = drain("bench.noop", 3)
        first.cyclone.append(rss)
        trail = [rss]
        for _ in range(9):
            _done, rss = drain("bench.noop", 3)
            trail.append(rss)
        many.cyclone.append(rss)
        many.extra["after_each_10k"] = trail
        _done, rss = drain("bench.fail", 1)
        failing.cyclone.append(rss)
        commands.put("stop")
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.terminate()
            proc.join()
    print(
        f"  j: RSS start {start_rss:.1f} MB, after {n:,} {first.cyclone[-1]:.1f}, "
        f"after {10 * n:,} {many.cyclone[-1]:.1f}, + {n:,} failing {failing.cyclone[-1]:.1f}"
    )


def fig_k(bench: Bench) -> None:
    """Figure a's 1-step new-key submit through PgBouncer (transaction mode), in turns."""
    if not bouncer.available():
        print("  k: no /usr/sbin/pgbouncer (apt-get install pgbouncer): skipped")
        return
    from bench.run import interleaved

    n = bench.sizes.new_keys
    f = bench.fig(
        "k",
        "submit_once new key, 1-step, via PgBouncer",
        "submits/s",
        True,
        goal=0.85,
        goal_text=">= 0.85x raw",
        raw_label="raw psycopg via PgBouncer",
    )
    direct = bench.fig(
        "k-ref-direct",
        "  ref: the same turns, direct",
        "submits/s",
        True,
        raw_label="raw psycopg",
    )
    bench.reset()
    pgb = bouncer.PgBouncer(bench.url)
    engine = sa.create_engine(pgb.url(), pool_size=5, connect_args={"prepare_threshold": None})
    raw_pgb = psycopg.connect(pgb.dsn(), autocommit=True, prepare_threshold=None)
    raw_direct = bench.raw_conn()
    try:

        def raw(conn: psycopg.Connection[Any], prefix: str) -> Any:
            def one(i: int) -> None:
                row = conn.execute(
                    workloads.RAW_INSERT_ONCE,
                    ("bench_one", f"{prefix}-{i}", json.dumps(workloads.payload(i))),
                ).fetchone()
                assert row is not None

            return one

        def once(eng: sa.Engine, prefix: str) -> Any:
            def one(i: int) -> None:
                _run, created = workloads.one_step.submit_once(
                    eng, f"{prefix}-{i}", workloads.payload(i)
                )
                assert created

            return one

        rates = interleaved(
            {
                "raw-pgb": (raw(raw_pgb, "k-raw-pgb"), n),
                "cyc-pgb": (once(engine, "k-cyc-pgb"), n),
                "raw": (raw(raw_direct, "k-raw"), n),
                "cyc": (once(bench.engine, "k-cyc"), n),
            }
        )
    finally:
        raw_pgb.close()
        raw_direct.close()
        engine.dispose()
        pgb.stop()
    f.cyclone.append(rates["cyc-pgb"])
    f.raw.append(rates["raw-pgb"])
    direct.cyclone.append(rates["cyc"])
    direct.raw.append(rates["raw"])
    print(
        f"  k: via PgBouncer cyclone {rates['cyc-pgb']:,.0f} / raw {rates['raw-pgb']:,.0f}; "
        f"direct cyclone {rates['cyc']:,.0f} / raw {rates['raw']:,.0f} submits/s"
    )


FIGURES = {"g": fig_g, "h": fig_h, "i": fig_i, "j": fig_j, "k": fig_k}
ORDER = [
    "g",
    "h-1p",
    "h-2p",
    "h-4p",
    "i-submits",
    "i-steps",
    "i-p50",
    "i-p99",
    "j-10k",
    "j-100k",
    "j-fail",
    "k",
    "k-ref-direct",
]
