"""Profiles behind the benchmark's unmet goals (run by hand; needs pyinstrument).

    .venv/bin/pip install pyinstrument py-spy
    .venv/bin/python -m bench.profile submit       # pyinstrument of submit_once, new + existing
    .venv/bin/python -m bench.profile drain        # where a Worker.drain() spends its time
    .venv/bin/python -m bench.profile ping         # timeline of one submit -> result()
    .venv/bin/python -m bench.profile explain      # server-side EXPLAIN ANALYZE of hot statements
    .venv/bin/python -m bench.profile parts        # the submit statement's cost, part by part
    .venv/bin/python -m bench.profile calls        # a new key's time, client path by path
    .venv/bin/python -m bench.profile notify       # 8 submitters: raw, raw + NOTIFY, cyclone
    .venv/bin/python -m bench.profile unprepared   # figure k: statements planned on every call
    .venv/bin/python -m bench.profile start        # a drain's fixed cost: drains of an empty queue

Each creates and drops its own throwaway database, like ``bench.run``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import cyclone
from bench import capture, run, scale, workloads


@contextmanager
def database(url: str) -> Iterator[sa.Engine]:
    admin = make_url(url)
    db = run.create_database(admin)
    engine = sa.create_engine(db, pool_size=10)
    try:
        cyclone.upgrade(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql(workloads.RAW_DDL)
        yield engine
    finally:
        engine.dispose()
        run.drop_database(admin, db)


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


def enqueue_noops(engine: sa.Engine, n: int) -> None:
    """``n`` available no-op standalone jobs in one statement (untimed set-up)."""
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
            "SELECT 'bench.noop', 'default', 0, 'available', to_jsonb(g), 3 "
            f"FROM generate_series(1, {int(n)}) g"
        )


def profile_drain(engine: sa.Engine, n: int, what: str, concurrency: int) -> None:
    """A pyinstrument profile of ``Worker.drain()``'s loop thread (the caller's)."""
    from pyinstrument import Profiler

    if what == "jobs":
        enqueue_noops(engine, n)
        w = cyclone.Worker(engine, steps=[workloads.noop], concurrency=concurrency, sweep=False)
    else:
        items = [(f"p{i}", workloads.payload(i)) for i in range(n // 3)]
        workloads.three_step.submit_once_many(engine, items)
        w = cyclone.Worker(
            engine, workflows=[workloads.three_step], concurrency=concurrency, sweep=False
        )
    with engine.begin() as conn:  # as autovacuum would after a bulk load (see run.analyze)
        conn.exec_driver_sql("ANALYZE cyclone_jobs, cyclone_runs")
    profiler = Profiler(interval=0.0002)
    profiler.start()
    t0 = time.perf_counter()
    ran = w.drain()
    wall = time.perf_counter() - t0
    profiler.stop()
    print(f"wall {wall:.3f} s for {ran} jobs: {wall / ran * 1e6:.0f} us each; {w.stats}")
    print(profiler.output_text(unicode=False, color=False, show_all=False))


def profile_ping(engine: sa.Engine, tries: int) -> None:
    """Where the submit -> result() time goes, with an idle worker in another process.

    Prints the client's time per call and, from marks taken on entry to and exit from
    the functions on the path in both processes, the median of each leg of a ping.
    """
    import multiprocessing

    from cyclone import _notify

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
            f"p99 {run.percentile([s * 1e3 for s in samples], 99):.2f} ms"
        )
        _timeline(trace.marks, served)
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
    from cyclone import _claim, worker

    trace = Trace()
    woken_by = "_on_notified" if hasattr(worker.Worker, "_on_notified") else "_on_jobs_available"
    trace.wrap(worker.Worker, woken_by, "jobs")
    trace.wrap(worker.Worker, "_take_outcomes", "loop")
    trace.wrap(_claim, "record_and_claim", "statement")
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


def _timeline(client: list[tuple[str, float]], served: list[tuple[str, float]]) -> None:
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


def explain(engine: sa.Engine) -> None:
    """EXPLAIN (ANALYZE, BUFFERS, WAL) of the hot statements, in a rolled-back transaction:
    submit_once of a new and of an existing key, a claim, a record+claim. The statements
    are those cyclone sends, captured through SQLAlchemy's cursor events."""
    wf = workloads.ping
    with capture.captured(engine) as seen:
        wf.submit_once(engine, "probe", 0)
        cyclone.Worker(engine, workflows=[wf], concurrency=48).drain()
    submit_sql, submit_params = capture.first(seen, "WITH")
    claim_sql, claim_params = capture.first(seen, capture.CLAIM)
    record_sql, record_params = capture.first(seen, capture.RECORD_AND_CLAIM)

    def show(title: str, sql: str, params: dict[str, Any]) -> list[Any]:
        """EXPLAIN the statement in a rolled-back transaction, then run it in autocommit."""
        with psycopg.connect(run.conninfo(engine.url)) as driver:
            rows = driver.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + sql, params).fetchall()
            driver.rollback()
            driver.autocommit = True
            print(f"--- {title}")
            keep = ("Time", "Trigger", "WAL")
            print("\n".join(r[0] for r in rows[:1] + rows[-6:] if any(w in r[0] for w in keep)))
            return driver.execute(sql, params).fetchall()

    for i in range(20):  # warm the caches; the 20 runs' jobs are the ones claimed below
        wf.submit_once(engine, f"w{i}", i)
    for key in ("x0", "x1", "x1"):
        show(f"submit_once key {key}", submit_sql, {**submit_params, "key": key})
    got = show("claim (23 available)", claim_sql, {**claim_params, "me": "x"})
    show(
        f"record {len(got)} successes + claim",
        record_sql,
        {**record_params, "me": "x", "items": capture.items(got)},
    )


def _drop_checks(conn: Any) -> None:
    for table in ("cyclone_runs",):
        names = conn.execute(
            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
            (table,),
        ).fetchall()
        for (name,) in names:
            conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")


_VARIANTS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "cyclone": ("the schema and statement as shipped", lambda c: None),
    "no NOTIFY": ("without the pg_notify of the new run", lambda c: None),
    "no checks": ("without the CHECK constraints of the runs table", _drop_checks),
    "no listing indexes": (
        "without the runs' created_at and listing indexes",
        lambda c: c.execute("DROP INDEX ix_cyclone_runs_created_at_id, ix_cyclone_runs_listing"),
    ),
    "no start index": (
        "without the index of the runs to start",
        lambda c: c.execute("DROP INDEX ix_cyclone_runs_start"),
    ),
}


def parts(url: str, n: int) -> None:
    """What the new-key and existing-key statement costs on the server, part by part.

    Each variant lives in its own database (cyclone's schema, then one change) and has
    its own connection; each round calls every variant and the raw baseline once, in a
    new random order, so a swing of the VM's commit latency hits all of them alike.
    Times are per call from the client, medians.
    """
    import json

    admin = make_url(url)
    plan = workloads.one_step.plan()
    full = plan.fast_insert_run_once.sql
    notify = full.index(", pg_notify(")
    silent = full[:notify] + full[full.index(" AS notified", notify) + len(" AS notified") :]
    created: list[Any] = []
    conns: dict[str, tuple[psycopg.Connection[Any], str | None]] = {}
    try:
        for label, (_what, change) in _VARIANTS.items():
            db = run.create_database(admin)
            created.append(db)
            engine = sa.create_engine(db, poolclass=sa.NullPool)
            cyclone.upgrade(engine)
            with engine.begin() as conn:
                conn.exec_driver_sql(workloads.RAW_DDL)
            engine.dispose()
            c = psycopg.connect(run.conninfo(db), autocommit=True)
            change(c)
            conns[label] = (c, silent if label == "no NOTIFY" else full)
        # The baseline gets a connection of its own: a backend that ran the previous call
        # is warmer, so sharing one, or a fixed order, favours one side.
        conns["raw psycopg"] = (psycopg.connect(run.conninfo(created[0]), autocommit=True), None)
        params = {"input": json.dumps(workloads.payload(1)), "deadline_at": None}
        params |= {"deadline_in": None, "retention": None}
        params |= {"start_at": None, "start_in": None, "trace_context": None}

        def call(c: psycopg.Connection[Any], sql: str | None, key: str) -> None:
            if sql is None:
                c.execute(workloads.RAW_INSERT_OR_SELECT, {**params, "wf": "w", "key": key})
            else:
                c.execute(sql, {**params, "key": key})

        results: dict[str, dict[str, float]] = defaultdict(dict)
        for phase in ("new key", "existing key"):
            samples: dict[str, list[float]] = defaultdict(list)
            order = list(conns)
            for i in range(n):
                random.shuffle(order)
                for label in order:
                    c, sql = conns[label]
                    t0 = time.perf_counter()
                    call(c, sql, f"k{i}")
                    samples[label].append(time.perf_counter() - t0)
            for label, values in samples.items():
                results[label][phase] = statistics.median(values[n // 20 :]) * 1e6
        wal: dict[str, float] = {}
        for label, (c, sql) in conns.items():
            before = c.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
            assert before is not None
            for i in range(200):
                call(c, sql, f"w{i}")
            row = c.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", before).fetchone()
            assert row is not None
            wal[label] = float(row[0]) / 200
        print(f"{n} calls per variant and phase, in random order, medians (us per call)")
        print(f"{'variant':<26} {'new key':>8} {'existing':>9} {'WAL B/new':>10}  what")
        for label in conns:
            by = results[label]
            what = _VARIANTS[label][0] if label in _VARIANTS else "one INSERT ... ON CONFLICT"
            print(
                f"{label:<26} {by['new key']:8.0f} {by['existing key']:9.0f} "
                f"{wal[label]:10.0f}  {what}"
            )
        for c, _sql in conns.values():
            c.close()
    finally:
        for db in created:
            run.drop_database(admin, db)


def new_key_statement() -> tuple[str, dict[str, Any]]:
    """The SQL ``submit_once`` sends for a new key of the 1-step workflow, and its
    parameters but ``key`` and ``input`` (no deadline, retention, delay or trace)."""
    wf = workloads.one_step
    compiled = wf.plan().fast_insert_run_once
    params = {**compiled.defaults, "workflow": wf.name, "deadline_at": None}
    params |= {"deadline_in": None, "retention": None, "start_at": None, "start_in": None}
    return compiled.sql, params | {"trace_context": None}


def calls(engine: sa.Engine, n: int) -> None:
    """Where a new key's time goes from the client: four calls interleaved call by call.

    Raw's insert on one connection; the same insert on a connection checked out of the
    engine's pool (autocommit switched on and off, as cyclone does); cyclone's statement
    sent on one connection; and ``submit_once``. Medians in microseconds per call.
    """
    import json

    wf = workloads.one_step
    stmt, params = new_key_statement()
    samples: dict[str, list[float]] = defaultdict(list)
    with psycopg.connect(run.conninfo(engine.url), autocommit=True) as one:
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


def unprepared(engine: sa.Engine, n: int) -> None:
    """Figure k's gap: a new key's statement with and without a server-side prepared plan.

    Behind PgBouncer in transaction mode the driver cannot prepare, so the server parses
    and plans every call. Raw's insert and cyclone's new-key statement, each prepared and
    unprepared on one direct connection, interleaved call by call (medians, us per call);
    then the planning time PostgreSQL reports for each (``EXPLAIN (ANALYZE, SUMMARY)``,
    medians of 50, rolled back).
    """
    import json

    stmt, params = new_key_statement()
    samples: dict[str, list[float]] = defaultdict(list)
    with psycopg.connect(run.conninfo(engine.url), autocommit=True) as conn:
        for i in range(n):
            body = json.dumps(workloads.payload(i))
            calls: list[tuple[str, str, Any, bool]] = [
                ("raw, prepared", workloads.RAW_INSERT_ONCE, ("w", f"a{i}", body), True),
                ("raw, unprepared", workloads.RAW_INSERT_ONCE, ("w", f"b{i}", body), False),
                ("cyclone, prepared", stmt, {**params, "key": f"c{i}", "input": body}, True),
                ("cyclone, unprepared", stmt, {**params, "key": f"d{i}", "input": body}, False),
            ]
            random.shuffle(calls)
            for label, sql, args, prepare in calls:
                t0 = time.perf_counter()
                conn.execute(sql, args, prepare=prepare).fetchall()
                samples[label].append(time.perf_counter() - t0)
        planning: dict[str, list[float]] = defaultdict(list)
        conn.autocommit = False
        for i in range(50):
            body = json.dumps(workloads.payload(i))
            for label, sql, args in (
                ("raw", workloads.RAW_INSERT_ONCE, ("w", f"e{i}", body)),
                ("cyclone", stmt, {**params, "key": f"f{i}", "input": body}),
            ):
                rows = conn.execute("EXPLAIN (ANALYZE, SUMMARY) " + sql, args).fetchall()
                conn.rollback()
                for (line,) in rows:
                    if line.startswith("Planning Time:"):
                        planning[label].append(float(line.split()[2]))
    print(f"{n} rounds, the four calls in a new random order each round, medians (us per call)")
    for label in ("raw, prepared", "raw, unprepared", "cyclone, prepared", "cyclone, unprepared"):
        print(f"{label:<22} {statistics.median(samples[label][n // 10 :]) * 1e6:8.0f}")
    for label, values in planning.items():
        print(f"planning time, {label:<8} {statistics.median(values) * 1e3:8.0f} us (EXPLAIN)")


def start(engine: sa.Engine, n: int) -> None:
    """A drain's fixed cost, which figure d's 5,000-job drains include, against its rate.

    ``drain()`` of an empty queue ``n`` times (the maintenance passes before and after,
    the worker's own connections), then drains of 5,000 and of 50,000 no-op jobs (inserted
    with ``generate_series``, then ANALYZEd as in figure d), twice each, in one process.
    """
    worker = cyclone.Worker(engine, steps=[workloads.noop], concurrency=4, sweep=False)
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        assert worker.drain() == 0
        took.append(time.perf_counter() - t0)
    print(f"drain() of an empty queue: median {statistics.median(took) * 1e3:.1f} ms of {n}")
    for jobs in (5_000, 50_000, 5_000, 50_000):
        with engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE cyclone_jobs, cyclone_runs CASCADE")
        enqueue_noops(engine, jobs)
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE cyclone_jobs, cyclone_runs")
        t0 = time.perf_counter()
        assert worker.drain() == jobs
        wall = time.perf_counter() - t0
        print(f"drain() of {jobs:,} jobs: {wall * 1e3:,.0f} ms, {jobs / wall:,.0f} jobs/s")


def notify(engine: sa.Engine, n: int, rounds: int = 3) -> None:
    """Figure g's 8 submitter processes: raw's insert, raw's insert with cyclone's NOTIFY,
    and ``submit_once``, in turns, each with the CPU per call of the submitters and of the
    server (from /proc) and how busy the machine was.

    PostgreSQL lets one notifying commit through at a time (each holds a lock from queueing
    its notification until its commit is flushed): "raw + NOTIFY" shows what that costs
    raw's insert; the CPU columns show whether cyclone's submits reach that limit, and
    the wait events of the database's backends (sampled from pg_stat_activity) what they
    wait for.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    url = engine.url.render_as_string(hide_password=False)
    dsn = run.conninfo(engine.url)
    per_proc = max(1, n // scale.SUBMITTERS)
    sides = ["raw", "raw-notify", "cyclone"]
    print(f"{scale.SUBMITTERS} processes x {per_proc} new keys per turn, {rounds} rounds")
    for r in range(rounds):
        for side in sides[r % 3 :] + sides[: r % 3]:
            args = [(url, dsn, side, f"n{r}-{side}-{p}", per_proc) for p in range(scale.SUBMITTERS)]
            with WaitEvents(dsn) as waits:
                timed = scale.spawn_timed(ctx, scale.submitter, args)
            print(f"  round {r} {side:<10} {timed.describe('submits')}", flush=True)
            print(f"    backends: {waits.summary()}", flush=True)


class WaitEvents:
    """Samples what the database's active backends wait for, every few milliseconds."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.counts: dict[str, int] = defaultdict(int)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> WaitEvents:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    def _sample(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(0.005):
                for (event,) in conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU') "
                    "FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'active' AND pid <> pg_backend_pid()"
                ):
                    self.counts[event] += 1

    def summary(self, most: int = 5) -> str:
        total = sum(self.counts.values()) or 1
        ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])[:most]
        return ", ".join(f"{event} {n / total:.0%}" for event, n in ranked)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument(
        "what",
        choices=[
            "submit",
            "drain",
            "drain-wf",
            "ping",
            "explain",
            "parts",
            "calls",
            "notify",
            "unprepared",
            "start",
        ],
    )
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--url", default=os.environ.get("CYCLONE_DATABASE_URL", run.DEFAULT_URL))
    args = parser.parse_args()
    if args.what == "parts":
        parts(args.url, args.n)
        return
    with database(args.url) as engine:
        if args.what == "submit":
            profile_submit(engine, args.n)
        elif args.what == "drain":
            profile_drain(engine, args.n, "jobs", args.concurrency)
        elif args.what == "drain-wf":
            profile_drain(engine, args.n, "workflow", args.concurrency)
        elif args.what == "ping":
            profile_ping(engine, min(args.n, 500))
        elif args.what == "calls":
            calls(engine, args.n)
        elif args.what == "notify":
            notify(engine, args.n)
        elif args.what == "unprepared":
            unprepared(engine, args.n)
        elif args.what == "start":
            start(engine, min(args.n, 50))
        else:
            explain(engine)


if __name__ == "__main__":
    main()
