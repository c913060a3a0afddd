"""A new key's time in the client: ``bench.profile submit`` (pyinstrument of
``submit_once``) and ``bench.profile calls`` (four client paths interleaved)."""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict

import psycopg
import sqlalchemy as sa

from bench import db, workloads
from bench.profiles.statements import new_key_statement


def profile_submit(engine: sa.Engine, n: int) -> None:
    from pyinstrument import Profiler

    wf = workloads.one_step
    for i in range(50):
        wf.submit_once(engine, f"w{i}", workloads.payload(i))
    profiler = Profiler(interval=0.0002)
    profiler.start()
    t0 = time.perf_counter()
    for i in range(n):
        wf.submit_once(engine, f"k{i}", workloads.payload(i))
    t1 = time.perf_counter()
    for i in range(n):
        wf.submit_once(engine, f"k{i}", workloads.payload(i))
    t2 = time.perf_counter()
    profiler.stop()
    print(f"new key {(t1 - t0) / n * 1e6:.0f} us, existing key {(t2 - t1) / n * 1e6:.0f} us")
    print(profiler.output_text(unicode=False, color=False, show_all=False))


def calls(engine: sa.Engine, n: int) -> None:
    """Where a new key's time goes from the client: four calls interleaved call by call.

    Raw's insert on one connection; the same insert on a connection checked out of the
    engine's pool (autocommit switched on and off, as cyclone does); cyclone's statement
    sent on one connection; and ``submit_once``. Medians in microseconds per call.
    """
    wf = workloads.one_step
    stmt, params = new_key_statement()
    samples: dict[str, list[float]] = defaultdict(list)
    with psycopg.connect(db.conninfo(engine.url), autocommit=True) as one:
        for i in range(n):
            body = json.dumps(workloads.payload(i))
            t0 = time.perf_counter()
            one.execute(workloads.RAW_INSERT_ONCE, ("w", f"a{i}", body)).fetchall()
            t1 = time.perf_counter()
            fairy = engine.raw_connection()
            driver = fairy.driver_connection
            assert driver is not None
            driver.autocommit = True
            driver.execute(workloads.RAW_INSERT_ONCE, ("w", f"b{i}", body)).fetchall()
            driver.autocommit = False
            fairy.close()
            t2 = time.perf_counter()
            one.execute(stmt, {**params, "key": f"c{i}", "input": body}).fetchall()
            t3 = time.perf_counter()
            wf.submit_once(engine, f"d{i}", workloads.payload(i))
            t4 = time.perf_counter()
            for label, took in (
                ("raw insert, one connection", t1 - t0),
                ("raw insert, pooled checkout", t2 - t1),
                ("cyclone's statement, one connection", t3 - t2),
                ("submit_once", t4 - t3),
            ):
                samples[label].append(took)
    print(f"{n} rounds, the four calls interleaved, medians (us per call)")
    for label, values in samples.items():
        print(f"{label:<38} {statistics.median(values[n // 10 :]) * 1e6:8.0f}")
