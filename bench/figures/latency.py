"""Figure e: submit -> result with an idle worker, beside a raw LISTEN/NOTIFY ping-pong.

Both idle workers run at once and the tries alternate, so that both sides see the same
stretch of the VM's commit latency: a raw LISTEN/NOTIFY worker process with a client
that LISTENs for done, and an idle cyclone ``Worker.run()`` process.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import sqlalchemy as sa

from bench import measure, procs, statements, workloads
from bench.harness import Bench

RAW_LABEL = "raw LISTEN/NOTIFY ping-pong"


def ping(engine: sa.Engine, key: str, i: int) -> float:
    """Seconds from ``submit_once`` of the ping workflow to its ``result()``."""
    t0 = time.perf_counter()
    run, _created = workloads.ping.submit_once(engine, key, i)
    value = run.result(timeout=30)
    elapsed = time.perf_counter() - t0
    assert value == i
    return elapsed


def fig_e(bench: Bench, r: int) -> None:
    """Median and p99 of ``tries`` pings a side, 50 ms apart; statements counted in round 0."""
    med = bench.fig(
        "e-p50",
        "submit -> result, median",
        "ms",
        False,
        goal=1.3,
        goal_text="<= 1.3x raw",
        raw_label=RAW_LABEL,
    )
    p99 = bench.fig(
        "e-p99",
        "submit -> result, p99",
        "ms",
        False,
        goal=1.5,
        goal_text="<= 1.5x raw",
        raw_label=RAW_LABEL,
    )
    stop = bench.mp.Event()
    raw_out: Any = bench.mp.Queue()
    raw_proc = bench.mp.Process(target=procs.raw_serve, args=(bench.dsn, stop, raw_out))
    out: Any = bench.mp.Queue()
    cyc_proc = bench.mp.Process(
        target=procs.cyclone_serve, args=(bench.sa_url, bench.concurrency, out)
    )
    raw_proc.start()
    cyc_proc.start()
    raw_samples: list[float] = []
    samples: list[float] = []
    try:
        measure.ready(raw_out, 1, timeout=60)
        measure.ready(out, 1, timeout=60)
        time.sleep(0.5)
        with bench.raw_conn() as conn:
            conn.execute("LISTEN raw_job_done")
            for i in range(5):
                procs.raw_ping(conn, -i)
                time.sleep(0.05)
                ping(bench.engine, f"e-{r}-w{i}", i)
                time.sleep(0.05)
            for i in range(bench.sizes.tries):
                raw_samples.append(procs.raw_ping(conn, i) * 1e3)
                time.sleep(0.05)
                samples.append(ping(bench.engine, f"e-{r}-{i}", i) * 1e3)
                time.sleep(0.05)
        if r == 0:
            ping(bench.counted, f"e-{r}-cw", 0)  # its listener listens from here on
            with statements.counting(bench.counted) as counter:
                for i in range(10):
                    ping(bench.counted, f"e-{r}-c{i}", i)
            bench.statements["submit -> result() (client side)"] = counter.per(10)
    finally:
        stop.set()
        # SIGTERM: the cyclone Worker.run() finishes and returns; the raw one sees ``stop``.
        measure.stop([cyc_proc], timeout=15, terminate=True)
        measure.stop([raw_proc], timeout=15)
    med.raw.append(statistics.median(raw_samples))
    p99.raw.append(measure.percentile(raw_samples, 99))
    med.cyclone.append(statistics.median(samples))
    p99.cyclone.append(measure.percentile(samples, 99))
