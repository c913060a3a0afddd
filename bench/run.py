"""cyclone's benchmark: every figure for cyclone and the raw psycopg baseline.

Run from the repository root (never from the test suite)::

    .venv/bin/python -m bench.run                 # full run: 5 rounds, ~6 minutes
    .venv/bin/python -m bench.run --quick         # small N, a smoke run
    .venv/bin/python -m bench.run --only a,b      # some figures only

It creates a throwaway database on the server, runs ``cyclone.upgrade``, measures, prints
a table of medians over rounds with the cyclone/raw ratio and each goal, writes
``bench/results/latest.json`` and ``bench/results/latest.png`` (copied to
``docs/bench.png``), and drops the database.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import signal
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/run.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

import cyclone
from bench import capture, procs, scale, workloads

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("CYCLONE_BENCH_RESULTS") or ROOT / "bench" / "results")
"""Where results go: ``bench/results``, or the folder ``CYCLONE_BENCH_RESULTS`` names."""
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
FIGURES = "abcdefghijk"


# --- settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    new_keys: int
    duplicates: int
    jobs: int
    tries: int
    batches: tuple[int, ...]
    small: int
    large: int
    grow_ops: int
    backlog: int = 50_000
    mixed_seconds: float = 60.0
    mixed_rate: float = 1_000.0
    memory_jobs: int = 10_000

    @classmethod
    def full(cls) -> Sizes:
        return cls(5_000, 1_000, 5_000, 50, (100, 1_000), 10_000, 1_000_000, 500)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            500, 200, 1_000, 20, (100, 1_000), 10_000, 100_000, 200, 5_000, 10.0, 500.0, 1_000
        )


@dataclass
class Figure:
    """One row of the table: cyclone's values and the baseline's, one per round."""

    id: str
    title: str
    unit: str
    higher_is_better: bool
    cyclone: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    raw_label: str = "raw psycopg"
    goal: float | None = None
    goal_text: str = ""
    goal_base: list[float] | None = None
    """The values the goal ratio is taken against (default: ``raw``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cyclone_median(self) -> float | None:
        return statistics.median(self.cyclone) if self.cyclone else None

    @property
    def raw_median(self) -> float | None:
        return statistics.median(self.raw) if self.raw else None

    @property
    def ratio(self) -> float | None:
        c, r = self.cyclone_median, self.raw_median
        return None if c is None or not r else c / r

    @property
    def goal_ratio(self) -> float | None:
        base = self.raw if self.goal_base is None else self.goal_base
        c = self.cyclone_median
        if c is None or not base:
            return None
        b = statistics.median(base)
        return c / b if b else None

    @property
    def met(self) -> bool | None:
        if self.goal is None or self.goal_ratio is None:
            return None
        if self.higher_is_better:
            return self.goal_ratio >= self.goal
        return self.goal_ratio <= self.goal

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            cyclone_median=self.cyclone_median,
            raw_median=self.raw_median,
            ratio=self.ratio,
            goal_ratio=self.goal_ratio,
            met=self.met,
        )
        return data


# --- database plumbing -----------------------------------------------------------------------


def create_database(admin_url: URL) -> URL:
    name = f"cyclone_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return admin_url.set(database=name)


def drop_database(admin_url: URL, url: URL) -> None:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


def conninfo(url: URL) -> str:
    """The plain libpq form of a SQLAlchemy URL, for raw psycopg connections."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class Bench:
    def __init__(self, url: URL, sizes: Sizes, rounds: int, concurrency: int) -> None:
        self.url = url
        self.sa_url = url.render_as_string(hide_password=False)
        self.dsn = conninfo(url)
        self.sizes = sizes
        self.rounds = rounds
        self.concurrency = concurrency
        # Timed figures use a plain engine; statements are counted on a second one whose
        # cursors report what they execute (that costs a few microseconds a statement).
        self.engine = sa.create_engine(url, pool_size=5, max_overflow=5)
        self.counted = sa.create_engine(
            url, pool_size=5, max_overflow=5, connect_args={"cursor_factory": CountingCursor}
        )
        self.figures: dict[str, Figure] = {}
        self.statements: dict[str, dict[str, float]] = {}
        self.mp = multiprocessing.get_context("spawn")
        self._claim_sql: Any = None

    def close(self) -> None:
        # The database is dropped WITH (FORCE): this process's LISTEN thread, idle, ends
        # when its connection does.
        self.engine.dispose()
        self.counted.dispose()

    # plumbing ------------------------------------------------------------------------------

    def fig(self, fid: str, title: str, unit: str, higher: bool, **kw: Any) -> Figure:
        if fid not in self.figures:
            self.figures[fid] = Figure(fid, title, unit, higher, **kw)
        return self.figures[fid]

    def sql(self, statement: str, **params: Any) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(statement, params or None)

    def reset(self) -> None:
        # TRUNCATE alone leaves the tables' statistics unknown (reltuples -1), as on a fresh
        # deploy. Do not ANALYZE the empty tables: with autovacuum off (as on the bench
        # server) the planner would then believe them empty for the whole round and plan
        # seq scans (the FK check of cyclone_jobs.run_id, the existing-key lookup), cached
        # per session, which grow with every row the round inserts.
        self.sql("TRUNCATE cyclone_signals, cyclone_jobs, cyclone_runs, raw_jobs, raw_runs")

    def analyze(self) -> None:
        """What autovacuum's ANALYZE does on a real server after a bulk load (it is off here).

        Without statistics the claim's cached generic plan reads every available job and
        sorts them (O(backlog)) instead of reading the claim index in order.
        """
        self.sql("ANALYZE cyclone_jobs, cyclone_runs, raw_jobs, raw_runs")

    def raw_conn(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn, autocommit=True)

    # a. new keys -------------------------------------------------------------------------

    def fig_a(self, r: int) -> None:
        n = self.sizes.new_keys
        raw = self.fig(
            "a1",
            "submit_once new key, 1-step",
            "submits/s",
            True,
            goal=0.85,
            goal_text=">= 0.85x raw",
        )
        five = self.fig(
            "a5",
            "submit_once new key, 5-step",
            "submits/s",
            True,
            goal=0.85,
            goal_text=">= 0.85x raw",
        )
        ref_auto = self.fig("a-ref-auto", "  ref: raw SQL via Core, autocommit", "submits/s", True)
        ref_begin = self.fig(
            "a-ref-begin", "  ref: raw SQL via Core, engine.begin()", "submits/s", True
        )
        five.raw = ref_auto.raw = ref_begin.raw = raw.raw
        raw_conn = self.raw_conn()
        try:
            # Reference points (no goal): the same raw statement through SQLAlchemy Core.
            rates = interleaved(
                {
                    "raw": (self._raw_new_key(raw_conn, f"a-raw-{r}"), n),
                    "one": (self._cyclone_new_key(workloads.one_step, f"a1-{r}"), n),
                    "five": (self._cyclone_new_key(workloads.five_step, f"a5-{r}"), n),
                    "auto": (self._core_new_key(f"a-auto-{r}", autocommit=True), n // 2),
                    "begin": (self._core_new_key(f"a-begin-{r}", autocommit=False), n // 2),
                }
            )
        finally:
            raw_conn.close()
        raw.raw.append(rates["raw"])
        raw.cyclone.append(rates["one"])
        five.cyclone.append(rates["five"])
        ref_auto.cyclone.append(rates["auto"])
        ref_begin.cyclone.append(rates["begin"])

    def _raw_new_key(self, conn: psycopg.Connection[Any], prefix: str) -> Callable[[int], None]:
        def one(i: int) -> None:
            row = conn.execute(
                workloads.RAW_INSERT_ONCE,
                ("bench_one", f"{prefix}-{i}", json.dumps(workloads.payload(i))),
            ).fetchone()
            assert row is not None

        return one

    def _cyclone_new_key(self, wf: cyclone.Workflow[Any], prefix: str) -> Callable[[int], None]:
        def one(i: int) -> None:
            _run, created = wf.submit_once(self.engine, f"{prefix}-{i}", workloads.payload(i))
            assert created

        return one

    def _core_new_key(self, prefix: str, *, autocommit: bool) -> Callable[[int], None]:
        stmt = sa.text(
            "INSERT INTO raw_runs (workflow, submit_key, input) "
            "VALUES (:wf, :key, CAST(:input AS jsonb)) ON CONFLICT DO NOTHING RETURNING id"
        )
        engine = (
            self.engine.execution_options(isolation_level="AUTOCOMMIT")
            if autocommit
            else self.engine
        )

        def one(i: int) -> None:
            params = {
                "wf": "bench_one",
                "key": f"{prefix}-{i}",
                "input": json.dumps(workloads.payload(i)),
            }
            if autocommit:
                with engine.connect() as conn:
                    conn.execute(stmt, params).first()
            else:
                with engine.begin() as conn:
                    conn.execute(stmt, params).first()

        return one

    # b. duplicates -------------------------------------------------------------------------

    def fig_b(self, r: int) -> None:
        n = self.sizes.duplicates
        f = self.fig(
            "b",
            "submit_once existing key",
            "us/call",
            False,
            goal=1.2,
            goal_text="<= 1.2x raw",
            raw_label="raw insert-or-select CTE",
        )
        keys = [f"b-{r}-{i}" for i in range(n + WARMUP)]
        inputs = [workloads.payload(i) for i in range(n + WARMUP)]
        items = list(zip(keys, inputs, strict=True))
        with self.raw_conn() as conn:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO raw_runs (workflow, submit_key, input) VALUES (%s, %s, %s)",
                    [("bench_one", k, json.dumps(v)) for k, v in items],
                )
            for start in range(0, len(items), 1000):
                workloads.one_step.submit_once_many(self.engine, items[start : start + 1000])

            def raw(i: int) -> None:
                row = conn.execute(
                    workloads.RAW_INSERT_OR_SELECT,
                    {"wf": "bench_one", "key": keys[i], "input": json.dumps(inputs[i])},
                ).fetchone()
                assert row is not None
                assert row[1:] == (False, True)

            def once(i: int) -> None:
                _run, created = workloads.one_step.submit_once(self.engine, keys[i], inputs[i])
                assert not created

            rates = interleaved({"raw": (raw, n), "cyclone": (once, n)})
        f.raw.append(1e6 / rates["raw"])
        f.cyclone.append(1e6 / rates["cyclone"])

    # c. batches ----------------------------------------------------------------------------

    def fig_c(self, r: int) -> None:
        n = self.sizes.new_keys
        single = self.figures.get("a1")
        for size in self.sizes.batches:
            f = self.fig(
                f"c{size}",
                f"submit_once_many, batch {size}",
                "submits/s",
                True,
                raw_label="raw one-at-a-time",
                goal=10.0 if size >= 1000 else None,
                goal_text=">= 10x cyclone one-at-a-time" if size >= 1000 else "",
            )
            if single is not None:
                f.raw = single.raw
                f.goal_base = single.cyclone
            items = [(f"c{size}-{r}-{i}", workloads.payload(i)) for i in range(n)]
            workloads.one_step.submit_once_many(
                self.engine, [(f"c{size}-{r}-w{i}", workloads.payload(i)) for i in range(size)]
            )
            t0 = time.perf_counter()
            for start in range(0, n, size):
                out = workloads.one_step.submit_once_many(self.engine, items[start : start + size])
                assert all(created for _run, created in out)
            f.cyclone.append(n / (time.perf_counter() - t0))

    # d. worker throughput ------------------------------------------------------------------

    def fig_d(self, r: int) -> None:
        n = self.sizes.jobs
        for nproc in (1, 2):
            jobs = self.fig(
                f"d-jobs-{nproc}p",
                f"worker, no-op jobs, {nproc} proc",
                "jobs/s",
                True,
                raw_label="raw SKIP LOCKED, 10/claim",
                goal=1.0 if nproc == 1 else None,
                goal_text=">= 1.0x raw" if nproc == 1 else "",
            )
            steps = self.fig(
                f"d-wf-{nproc}p",
                f"worker, 3-step wf steps, {nproc} proc",
                "steps/s",
                True,
                raw_label="raw SKIP LOCKED, 10/claim",
                goal=0.7 if nproc == 1 else None,
                goal_text=">= 0.7x raw" if nproc == 1 else "",
            )
            self.sql(
                "INSERT INTO raw_jobs (kind, args) "
                "SELECT 'noop', to_jsonb(g) FROM generate_series(1, %(n)s) g",
                n=n,
            )
            self.analyze()
            raw_rate, raw_done = self._spawn_drain(procs.raw_drain, (self.dsn, 10), nproc)
            self._expect(raw_done, n, "raw drain")
            jobs.raw.append(raw_rate)
            steps.raw = jobs.raw
            self.sql(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
                "SELECT 'bench.noop', 'default', 0, 'available', to_jsonb(g), 3 "
                "FROM generate_series(1, %(n)s) g",
                n=n,
            )
            self.analyze()
            rate, done = self._spawn_drain(
                procs.cyclone_drain, (self.sa_url, "jobs", self.concurrency), nproc
            )
            self._expect(done, n, "cyclone jobs drain")
            jobs.cyclone.append(rate)
            runs = (n + 2) // 3
            items = [(f"d{nproc}-{r}-{i}", workloads.payload(i)) for i in range(runs)]
            for start in range(0, runs, 1000):
                workloads.three_step.submit_once_many(self.engine, items[start : start + 1000])
            self.analyze()
            rate, done = self._spawn_drain(
                procs.cyclone_drain, (self.sa_url, "workflow", self.concurrency), nproc
            )
            self._expect(done, runs * 3, "cyclone workflow drain")
            steps.cyclone.append(rate)
        # Reference (no goal): the same 1-process drain behind a backlog of another kind.
        behind = self.fig(
            "d-jobs-foreign",
            f"  ref: no-op jobs, 1 proc, {FOREIGN:,} others' jobs queued",
            "jobs/s",
            True,
            raw_label="raw SKIP LOCKED, 10/claim",
        )
        behind.raw = self.figures["d-jobs-1p"].raw
        for kind, count in (("bench.foreign", FOREIGN), ("bench.noop", n)):
            self.sql(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
                "SELECT %(kind)s, 'default', 0, 'available', to_jsonb(g), 3 "
                "FROM generate_series(1, %(n)s) g",
                kind=kind,
                n=count,
            )
        self.analyze()
        rate, done = self._spawn_drain(
            procs.cyclone_drain, (self.sa_url, "jobs", self.concurrency), 1
        )
        self._expect(done, n, "cyclone jobs drain behind a foreign backlog")
        behind.cyclone.append(rate)

    @staticmethod
    def _expect(done: int, wanted: int, what: str) -> None:
        if done != wanted:
            print(f"  warning: {what} ran {done} jobs, expected {wanted}", file=sys.stderr)

    def _spawn_drain(
        self, target: Callable[..., None], args: tuple[Any, ...], nproc: int
    ) -> tuple[float, int]:
        from bench import scale

        timed = scale.spawn_timed(self.mp, target, [args] * nproc)
        return timed.rate, timed.total

    # e. submit -> result latency -----------------------------------------------------------

    def fig_e(self, r: int) -> None:
        tries = self.sizes.tries
        med = self.fig(
            "e-p50",
            "submit -> result, median",
            "ms",
            False,
            goal=1.3,
            goal_text="<= 1.3x raw",
            raw_label="raw LISTEN/NOTIFY ping-pong",
        )
        p99 = self.fig(
            "e-p99",
            "submit -> result, p99",
            "ms",
            False,
            goal=1.5,
            goal_text="<= 1.5x raw",
            raw_label="raw LISTEN/NOTIFY ping-pong",
        )
        # Both idle workers run at once and the tries alternate, so that both sides see
        # the same stretch of the VM's commit latency: a raw LISTEN/NOTIFY worker process
        # with a client that LISTENs for done, and an idle cyclone Worker.run() process.
        stop = self.mp.Event()
        raw_out: Any = self.mp.Queue()
        raw_proc = self.mp.Process(target=procs.raw_serve, args=(self.dsn, stop, raw_out))
        out: Any = self.mp.Queue()
        cyc_proc = self.mp.Process(
            target=procs.cyclone_serve, args=(self.sa_url, self.concurrency, out)
        )
        raw_proc.start()
        cyc_proc.start()
        raw_samples: list[float] = []
        samples: list[float] = []
        try:
            raw_out.get(timeout=60)
            out.get(timeout=60)
            time.sleep(0.5)
            with self.raw_conn() as conn:
                conn.execute("LISTEN raw_job_done")
                for i in range(5):
                    procs.raw_ping(conn, -i)
                    time.sleep(0.05)
                    self._ping(f"e-{r}-w{i}", i)
                    time.sleep(0.05)
                for i in range(tries):
                    raw_samples.append(procs.raw_ping(conn, i) * 1e3)
                    time.sleep(0.05)
                    samples.append(self._ping(f"e-{r}-{i}", i) * 1e3)
                    time.sleep(0.05)
            if r == 0:
                self._ping(f"e-{r}-cw", 0, self.counted)  # its listener listens from here on
                with self.counting() as counter:
                    for i in range(10):
                        self._ping(f"e-{r}-c{i}", i, self.counted)
                self.statements["submit -> result() (client side)"] = counter.per(10)
        finally:
            stop.set()
            if cyc_proc.pid is not None:
                cyc_proc.terminate()  # SIGTERM: Worker.run() finishes and returns
            for proc in (raw_proc, cyc_proc):
                proc.join(timeout=15)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        med.raw.append(statistics.median(raw_samples))
        p99.raw.append(percentile(raw_samples, 99))
        med.cyclone.append(statistics.median(samples))
        p99.cyclone.append(percentile(samples, 99))

    def _ping(self, key: str, i: int, engine: sa.Engine | None = None) -> float:
        t0 = time.perf_counter()
        run, _created = workloads.ping.submit_once(engine or self.engine, key, i)
        value = run.result(timeout=30)
        elapsed = time.perf_counter() - t0
        assert value == i
        return elapsed

    # f. cost as the work grows -------------------------------------------------------------

    def fig_f(self) -> None:
        small, large = self.sizes.small, self.sizes.large
        label_s, label_l = human(small), human(large)
        self.reset()
        measured: dict[int, dict[str, list[float]]] = {}
        have = 0
        for size in (small, large):
            t0 = time.perf_counter()
            self._fill(have, size)
            have = size
            self.sql("VACUUM ANALYZE")
            print(f"  f: filled to {human(size)} runs in {time.perf_counter() - t0:.0f} s")
            got: dict[str, list[float]] = {k: [] for k in ("sub", "raw_sub", "claim", "raw_claim")}
            for r in range(self.rounds):
                got["claim"].append(self._grow_claim())
                got["raw_claim"].append(self._grow_raw_claim())
                got["sub"].append(self._grow_submit(f"f{size}-{r}"))
                got["raw_sub"].append(self._grow_raw_submit(f"fr{size}-{r}"))
                self._settle_submitted()
            measured[size] = got
        for what, title, unit in (
            ("sub", "submit_once new key", "us/call"),
            ("claim", "worker claim+complete, 10 jobs", "us/batch"),
        ):
            at_small = self.fig(f"f-{what}-small", f"{title} @ {label_s} runs", unit, False)
            at_small.cyclone = measured[small][what]
            at_small.raw = measured[small][f"raw_{what}"]
            at_large = self.fig(
                f"f-{what}-large",
                f"{title} @ {label_l} runs",
                unit,
                False,
                goal=1.3,
                goal_text=f"<= 1.3x cyclone @ {label_s}",
            )
            at_large.cyclone = measured[large][what]
            at_large.raw = measured[large][f"raw_{what}"]
            at_large.goal_base = at_small.cyclone

    def _fill(self, lo: int, hi: int) -> None:
        graph = workloads.one_step.plan().graph
        chunk = 200_000
        for start in range(lo, hi, chunk):
            end = min(hi, start + chunk)
            self.sql(
                """
                WITH r AS (
                    INSERT INTO cyclone_runs (workflow, submit_key, input, graph, state,
                        steps_remaining, created_at, finalized_at)
                    SELECT 'bench_one', 'filler-' || g,
                        jsonb_build_object('order', g, 'amount', 4200, 'currency', 'EUR'),
                        %(graph)s::jsonb, 'completed', 0,
                        now() - interval '1 day', now() - interval '1 day'
                    FROM generate_series(%(lo)s::int, %(hi)s::int) g
                    RETURNING id, workflow, input, created_at, finalized_at
                )
                INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, priority, state, deps,
                    pending_deps, attempt, max_attempts, output, created_at, scheduled_at,
                    attempted_at, finalized_at)
                SELECT id, workflow, 'only', 'default', 0, 'completed', '{}', 0, 1, 3, 'null',
                    created_at, created_at, created_at, finalized_at
                FROM r
                """,
                graph=graph,
                lo=start,
                hi=end - 1,
            )
            self.sql(
                """
                WITH r AS (
                    INSERT INTO raw_runs (workflow, submit_key, input, state, created_at)
                    SELECT 'bench_one', 'filler-' || g,
                        jsonb_build_object('order', g, 'amount', 4200, 'currency', 'EUR'),
                        'completed', now() - interval '1 day'
                    FROM generate_series(%(lo)s::int, %(hi)s::int) g
                    RETURNING input
                )
                INSERT INTO raw_jobs (kind, state, args, output, attempt, finalized_at)
                SELECT 'noop', 'completed', input, 'null', 1, now() FROM r
                """,
                lo=start,
                hi=end - 1,
            )

    def _settle_submitted(self) -> None:
        """Finish the runs ``_grow_submit`` made, as a worker serving them would.

        Left waiting, they would sit in the index of runs to start (or, as jobs, at the
        head of the claim index) for the next figures; the raw submits leave nothing
        behind.
        """
        self.sql(
            "UPDATE cyclone_jobs SET state = 'completed', attempt = 1, finalized_at = now() "
            "WHERE workflow = 'bench_one' AND state IN ('available', 'blocked')"
        )
        self.sql(
            "UPDATE cyclone_runs SET start_at = NULL, state = 'completed', steps_remaining = 0, "
            "finalized_at = now() WHERE workflow = 'bench_one' AND start_at IS NOT NULL"
        )

    def _grow_submit(self, prefix: str) -> float:
        n = self.sizes.grow_ops
        for i in range(20):
            workloads.one_step.submit_once(self.engine, f"{prefix}-w{i}", workloads.payload(i))
        t0 = time.perf_counter()
        for i in range(n):
            workloads.one_step.submit_once(self.engine, f"{prefix}-{i}", workloads.payload(i))
        return (time.perf_counter() - t0) / n * 1e6

    def _grow_raw_submit(self, prefix: str) -> float:
        n = self.sizes.grow_ops
        with self.raw_conn() as conn:
            for i in range(20):
                conn.execute(workloads.RAW_INSERT_ONCE, ("bench_one", f"{prefix}-w{i}", "{}"))
            t0 = time.perf_counter()
            for i in range(n):
                conn.execute(
                    workloads.RAW_INSERT_ONCE,
                    ("bench_one", f"{prefix}-{i}", json.dumps(workloads.payload(i))),
                ).fetchone()
            return (time.perf_counter() - t0) / n * 1e6

    def _grow_claim(self) -> float:
        """The worker's cycle: one statement records the last batch's outcomes and claims 10.

        The statements are the ones a Worker sends, captured through SQLAlchemy's cursor
        events from a drain of 20 jobs with ``concurrency=10`` (see bench/capture.py).
        """
        cycles = 50
        if self._claim_sql is None:
            self.sql(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
                "SELECT 'bench.noop', 'default', 0, 'available', to_jsonb(g), 3 "
                "FROM generate_series(1, 20) g"
            )
            probe = sa.create_engine(self.engine.url, poolclass=sa.NullPool)
            try:
                with capture.captured(probe) as seen:
                    cyclone.Worker(probe, steps=[workloads.noop], concurrency=10).drain()
                self._claim_sql = (
                    capture.first(seen, capture.CLAIM),
                    capture.first(seen, capture.RECORD_AND_CLAIM),
                )
            finally:
                probe.dispose()
        (claim_sql, claim_params), (record_sql, record_params) = self._claim_sql
        self.sql(
            "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
            "SELECT 'bench.noop', 'default', 0, 'available', to_jsonb(g), 3 "
            "FROM generate_series(1, %(n)s) g",
            n=cycles * 10 + 10,
        )
        me = f"bench-{os.getpid()}"
        rows: list[Any] = []
        times = []
        with self.raw_conn() as conn:
            conn.autocommit = True
            for i in range(cycles + 1):
                t0 = time.perf_counter()
                if i == 0:
                    rows = conn.execute(claim_sql, {**claim_params, "me": me}).fetchall()
                else:
                    params = {**record_params, "me": me, "items": capture.items(rows)}
                    rows = conn.execute(record_sql, params).fetchall()
                times.append(time.perf_counter() - t0)
            params = {**record_params, "me": me, "items": capture.items(rows)}
            conn.execute(record_sql.replace("LIMIT 10", "LIMIT 0"), params).fetchall()
        return statistics.median(times[1:]) * 1e6

    def _grow_raw_claim(self) -> float:
        cycles = 50
        self.sql(
            "INSERT INTO raw_jobs (kind, args) "
            "SELECT 'noop', to_jsonb(g) FROM generate_series(1, %(n)s) g",
            n=cycles * 10,
        )
        times = []
        with self.raw_conn() as conn:
            for _ in range(cycles):
                t0 = time.perf_counter()
                rows = conn.execute(workloads.RAW_CLAIM, (10,)).fetchall()
                conn.execute(workloads.RAW_COMPLETE, ([row[0] for row in rows],))
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    # statements per operation --------------------------------------------------------------

    @contextmanager
    def counting(self, engine: sa.Engine | None = None) -> Iterator[StatementCounter]:
        counter = StatementCounter()
        target = engine or self.counted
        sa.event.listen(target, "begin", counter.on_begin)
        sa.event.listen(target, "commit", counter.on_commit)
        _COUNTERS.append(counter)
        try:
            yield counter
        finally:
            _COUNTERS.remove(counter)
            sa.event.remove(target, "begin", counter.on_begin)
            sa.event.remove(target, "commit", counter.on_commit)

    def count_statements(self) -> None:
        one, five = workloads.one_step, workloads.five_step
        n = 50
        for i in range(5):
            one.submit_once(self.counted, f"st-w{i}", workloads.payload(i))
        with self.counting() as c:
            for i in range(n):
                one.submit_once(self.counted, f"st-{i}", workloads.payload(i))
        self.statements["submit_once, new key (1-step)"] = c.per(n)
        with self.counting() as c:
            for i in range(n):
                five.submit_once(self.counted, f"st-{i}", workloads.payload(i))
        self.statements["submit_once, new key (5-step)"] = c.per(n)
        with self.counting() as c:
            for i in range(n):
                one.submit_once(self.counted, f"st-{i}", workloads.payload(i))
        self.statements["submit_once, existing key"] = c.per(n)
        items = [(f"stm-{i}", workloads.payload(i)) for i in range(1000)]
        with self.counting() as c:
            one.submit_once_many(self.counted, items)
        self.statements["submit_once_many, batch of 1,000 (per batch)"] = c.per(1)
        # The worker, in this process: standalone jobs, then 3-step workflow runs.
        jobs = 200
        self.sql(
            "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
            "SELECT 'bench.noop', 'default', 0, 'available', to_jsonb(g), 3 "
            "FROM generate_series(1, %(n)s) g",
            n=jobs,
        )
        engine = sa.create_engine(
            self.url,
            pool_size=self.concurrency + 2,
            connect_args={"cursor_factory": CountingCursor},
        )
        worker = cyclone.Worker(
            engine, steps=[workloads.noop], concurrency=self.concurrency, sweep=False
        )
        with self.counting(engine) as c:
            ran = worker.drain()
        self.statements[f"worker drain, per no-op job ({ran} jobs)"] = c.per(ran)
        runs = 100
        workloads.three_step.submit_once_many(
            self.engine, [(f"stw-{i}", workloads.payload(i)) for i in range(runs)]
        )
        worker = cyclone.Worker(
            engine, workflows=[workloads.three_step], concurrency=self.concurrency, sweep=False
        )
        with self.counting(engine) as c:
            ran = worker.drain()
        self.statements[f"worker drain, per workflow step ({ran} steps)"] = c.per(ran)
        engine.dispose()


_COUNTERS: list[StatementCounter] = []


class CountingCursor(psycopg.Cursor[Any]):
    """Reports each statement to the active counters: cyclone's fast path sends statements
    on the driver connection, where SQLAlchemy's cursor events do not see them."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else str(query)
        if not text.lstrip().upper().startswith("LISTEN"):
            for counter in list(_COUNTERS):
                counter.on_execute(None, self, text)
        return super().execute(query, params, **kwargs)


class StatementCounter:
    """Counts statements (by what they do, at the driver) and transactions (SQLAlchemy's)."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.begins = 0
        self.commits = 0

    def on_execute(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.kinds[classify(statement)] += 1

    def on_begin(self, conn: Any) -> None:
        self.begins += 1

    def on_commit(self, conn: Any) -> None:
        self.commits += 1

    def per(self, n: int) -> dict[str, float]:
        out = {"statements": sum(self.kinds.values()) / n, "transactions": self.commits / n}
        out.update({f"  {k}": v / n for k, v in sorted(self.kinds.items())})
        return out


def classify(statement: str) -> str:
    s = " ".join(statement.split())
    if "SKIP LOCKED" in s and "jsonb_to_recordset" in s:
        return "record+claim"
    if "SKIP LOCKED" in s and "UPDATE cyclone_jobs" in s:
        return "claim"
    if "UPDATE cyclone_jobs" in s and "jsonb_to_recordset" in s:
        return "complete"
    if "INSERT INTO cyclone_runs" in s:
        return "insert run"
    if s.startswith("SELECT") and "cyclone_runs" in s:
        return "read run"
    if "heartbeat_at=now()" in s.replace(" ", "") and "rescue" not in s:
        return "heartbeat/rescue/expire"
    if "cyclone_runs" in s and "deadline" in s:
        return "heartbeat/rescue/expire"
    return "other"


# --- reporting -------------------------------------------------------------------------------


CHUNKS = 20
FOREIGN = 25_000
WARMUP = 20


def interleaved(sides: dict[str, tuple[Callable[[int], None], int]]) -> dict[str, float]:
    """Calls per second of each side, its ``n`` calls run in turns of ``n / CHUNKS``.

    Taking turns spreads the VM's drifting commit latency over every side alike, where
    one block after another would hand each side a different stretch of it. Each side
    first makes ``WARMUP`` untimed calls (indexes from ``n`` up).
    """
    for fn, n in sides.values():
        for i in range(n, n + WARMUP):
            fn(i)
    spent = dict.fromkeys(sides, 0.0)
    for chunk in range(CHUNKS):
        for name, (fn, n) in sides.items():
            lo, hi = n * chunk // CHUNKS, n * (chunk + 1) // CHUNKS
            t0 = time.perf_counter()
            for i in range(lo, hi):
                fn(i)
            spent[name] += time.perf_counter() - t0
    return {name: n / spent[name] for name, (_fn, n) in sides.items()}


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * pct / 100
    lo = int(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def human(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


HEADERS = ["figure", "unit", "cyclone", "raw", "baseline", "cyclone/raw", "goal", "got", "met"]


def table_rows(figures: Sequence[Figure]) -> list[list[str]]:
    rows = []
    for f in figures:
        met = {True: "yes", False: "NO", None: ""}[f.met]
        rows.append(
            [
                f.title,
                f.unit,
                fmt(f.cyclone_median),
                fmt(f.raw_median),
                f.raw_label,
                "-" if f.ratio is None else f"{f.ratio:.2f}",
                f.goal_text,
                "" if f.goal is None or f.goal_ratio is None else f"{f.goal_ratio:.2f}x",
                met,
            ]
        )
    return rows


def print_table(figures: Sequence[Figure], statements: dict[str, dict[str, float]]) -> None:
    rows = table_rows(figures)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [HEADERS, *rows]) for i in range(len(HEADERS))]
        for r in [HEADERS, *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        print()
        for op, counts in statements.items():
            print(op + ": " + ", ".join(f"{k.strip()} {v:.2f}" for k, v in counts.items()))
        return
    console = Console(width=160)
    table = Table(title="cyclone vs raw psycopg (medians over rounds)")
    for h in HEADERS:
        table.add_column(h, justify="right" if h in ("cyclone", "raw", "cyclone/raw") else "left")
    for r in rows:
        style = {"NO": "red", "yes": "green"}.get(r[-1])
        table.add_row(*r, style=style)
    console.print(table)
    st = Table(title="statements per operation (counted at the driver cursor)")
    st.add_column("operation")
    st.add_column("statements", justify="right")
    st.add_column("transactions", justify="right")
    st.add_column("by kind")
    for op, counts in statements.items():
        kinds = ", ".join(f"{k.strip()} {v:.2f}" for k, v in counts.items() if k.startswith("  "))
        st.add_row(op, f"{counts['statements']:.2f}", f"{counts['transactions']:.2f}", kinds)
    console.print(st)


def markdown_table(figures: Sequence[Figure]) -> str:
    rows = table_rows(figures)
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def chart(figures: Sequence[Figure], path: Path, meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    goals = [f for f in figures if f.goal is not None and f.goal_ratio]
    rate = [f for f in figures if f.higher_is_better and f.raw and not f.id.startswith("a-ref")]
    lat = [f for f in figures if not f.higher_is_better and f.raw]
    fig, axes = plt.subplots(2, 1, figsize=(12, 14), gridspec_kw={"height_ratios": [1, 1.7]})

    ax = axes[0]
    scores = []
    for f in goals:
        assert f.goal is not None
        assert f.goal_ratio is not None
        scores.append(f.goal_ratio / f.goal if f.higher_is_better else f.goal / f.goal_ratio)
    names = [f"{f.title} ({f.goal_text})" for f in goals]
    colors = ["tab:green" if s >= 1 else "tab:red" for s in scores]
    ax.barh(names, scores, color=colors)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("goal attainment (>= 1 means the goal is met)")
    ax.set_title("Goals")

    ax = axes[1]
    # Batches compare cyclone with itself one at a time: their goal panel shows them.
    compared = [
        f for f in (*rate, *lat) if f.cyclone_median and f.raw_median and not f.id.startswith("c")
    ]
    # One linear axis for every figure: how fast cyclone is relative to its baseline
    # (throughput ratio, or inverse latency ratio), so 1.0 means as fast as the baseline.
    speed = [
        (f.cyclone_median or 0) / (f.raw_median or 1)
        if f.higher_is_better
        else (f.raw_median or 0) / (f.cyclone_median or 1)
        for f in compared
    ]
    ax.barh(
        [f"{f.title} (vs {f.raw_label})" for f in compared],
        speed,
        color=["tab:blue" if s >= 1 else "tab:orange" for s in speed],
    )
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    for y, value in enumerate(speed):
        ax.text(value, y, f" {value:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("cyclone's speed relative to the baseline (linear; 1.0 = as fast)")
    ax.set_title("cyclone beside its baseline, same run, same server")
    fig.suptitle(
        f"cyclone benchmark, {meta['date']} — {meta['nproc']} cores, PostgreSQL "
        f"{meta['postgres']}, Python {meta['python']}, "
        f"medians of {meta.get('rounds_done', meta['rounds'])} rounds",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def git_describe() -> str:
    import subprocess

    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "cyclone", "alembic"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + (" (cyclone/ modified)" if dirty else "")


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 2 in --quick)")
    parser.add_argument("--quick", action="store_true", help="small N: a smoke run")
    parser.add_argument(
        "--only", default=FIGURES, help="figures to run, e.g. 'a' or 'a,d' (default: all)"
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("CYCLONE_DATABASE_URL", DEFAULT_URL),
        help="server URL (a throwaway database is created on it)",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="Worker(concurrency=...)")
    parser.add_argument("--no-statements", action="store_true", help="skip statement counts")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--report",
        action="store_true",
        help="measure nothing: print the table and redraw the chart from latest.json",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="minutes: start no round that would end after this (default 60)",
    )
    return parser.parse_args(argv)


STOP = threading.Event()


def _on_signal(signum: int, frame: Any) -> None:
    print(f"signal {signum}: finishing the current figure, then reporting", flush=True)
    STOP.set()


def write_results(
    bench: Bench, meta: dict[str, Any], started: float, *, chart_too: bool, show: bool = False
) -> None:
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["loadavg_end"] = os.getloadavg()
    figures = list(bench.figures.values())
    order = {fid: i for i, fid in enumerate(FIGURE_ORDER)}
    figures.sort(key=lambda f: order.get(f.id, len(order)))
    if show:
        print()
        print_table(figures, bench.statements)
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = {
        "meta": meta,
        "figures": [f.to_json() for f in figures],
        "statements": bench.statements,
        "markdown": markdown_table(figures),
    }
    (RESULTS / "latest.json").write_text(json.dumps(data, indent=2))
    print(f"wrote {RESULTS / 'latest.json'}", flush=True)
    if chart_too:
        try:
            chart(figures, RESULTS / "latest.png", meta)
        except Exception as exc:  # the numbers matter more than the picture
            print(f"no chart: {exc!r}", file=sys.stderr)
            return
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copyfile(RESULTS / "latest.png", ROOT / "docs" / "bench.png")
        print(f"wrote {RESULTS / 'latest.png'} and docs/bench.png")


def report_only() -> int:
    """Print the table and redraw the chart of the last run from ``latest.json``."""
    data = json.loads((RESULTS / "latest.json").read_text())
    names = {f.name for f in fields(Figure)}
    figures = [Figure(**{k: v for k, v in f.items() if k in names}) for f in data["figures"]]
    print_table(figures, data["statements"])
    chart(figures, RESULTS / "latest.png", data["meta"])
    (ROOT / "docs").mkdir(exist_ok=True)
    shutil.copyfile(RESULTS / "latest.png", ROOT / "docs" / "bench.png")
    print(f"wrote {RESULTS / 'latest.png'} and docs/bench.png")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        return report_only()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    rounds = args.rounds or (2 if args.quick else 5)
    only = {c for c in args.only.lower() if c in FIGURES}
    admin_url = make_url(args.url)
    started = time.perf_counter()
    url = create_database(admin_url)
    print(f"database {url.database} on {url.host}:{url.port}; rounds={rounds}, {sizes}")
    bench = Bench(url, sizes, rounds, args.concurrency)
    try:
        cyclone.upgrade(bench.engine)
        bench.sql(workloads.RAW_DDL)
        with psycopg.connect(bench.dsn) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            sync = conn.execute("SHOW synchronous_commit").fetchone()
        meta = {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "nproc": os.cpu_count(),
            "postgres": row[0] if row else "?",
            "synchronous_commit": sync[0] if sync else "?",
            "python": platform.python_version(),
            "sqlalchemy": sa.__version__,
            "psycopg": psycopg.__version__,
            "msgspec": msgspec.__version__,
            "platform": platform.platform(),
            "rounds": rounds,
            "sizes": asdict(sizes),
            "concurrency": args.concurrency,
            "quick": args.quick,
            "only": "".join(sorted(only)),
            "git": git_describe(),
            "loadavg_start": os.getloadavg(),
        }
        setup = 0.0
        steps: list[tuple[str, Callable[[int], None]]] = [
            ("a", bench.fig_a),
            ("b", bench.fig_b),
            ("c", bench.fig_c),
            ("d", bench.fig_d),
            ("e", bench.fig_e),
        ]
        if not args.no_statements:
            bench.reset()
            bench.count_statements()
        done = 0
        for r in range(rounds):
            elapsed = time.perf_counter() - started
            per_round = (elapsed - setup) / done if done else 0.0
            if STOP.is_set() or (done and elapsed + per_round > args.budget * 60):
                print(f"stopping after {done} rounds ({elapsed:.0f} s elapsed)")
                break
            if r == 0:
                setup = elapsed
            for letter, run in steps:
                if letter in only and not STOP.is_set():
                    # Empty tables for every figure: a figure's leftovers (such as the
                    # available jobs of a, b and c, which no drain worker of d serves) would
                    # otherwise be read past by the next figure's statements.
                    bench.reset()
                    t0 = time.perf_counter()
                    run(r)
                    took = time.perf_counter() - t0
                    print(f"round {r + 1}/{rounds} figure {letter}: {took:.1f} s", flush=True)
            if STOP.is_set():
                break
            done += 1
            meta["rounds_done"] = done
            write_results(bench, meta, started, chart_too=False)
        # Once each, after the rounds: many processes, memory, PgBouncer.
        for letter, figure in scale.FIGURES.items():
            if letter in only and not STOP.is_set():
                t0 = time.perf_counter()
                figure(bench)
                print(f"figure {letter}: {time.perf_counter() - t0:.1f} s", flush=True)
                write_results(bench, meta, started, chart_too=False)
        # Last: its million-row VACUUM ANALYZE would leave statistics that misplan the rounds.
        if "f" in only and not STOP.is_set():
            t0 = time.perf_counter()
            bench.fig_f()
            print(f"figure f: {time.perf_counter() - t0:.1f} s")
        meta["rounds_done"] = done
        write_results(bench, meta, started, chart_too=not args.no_chart, show=True)
        print(f"total {meta['seconds']:.0f} s")
    finally:
        bench.close()
        drop_database(admin_url, url)
    return 0


FIGURE_ORDER = [
    "a1",
    "a5",
    "a-ref-auto",
    "a-ref-begin",
    "b",
    "c100",
    "c1000",
    "d-jobs-1p",
    "d-wf-1p",
    "d-jobs-2p",
    "d-wf-2p",
    "e-p50",
    "e-p99",
    "f-sub-small",
    "f-sub-large",
    "f-claim-small",
    "f-claim-large",
    *scale.ORDER,
]


if __name__ == "__main__":
    sys.exit(main())
