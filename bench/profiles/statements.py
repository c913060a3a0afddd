"""The new-key statement at the server: ``bench.profile explain``, ``parts`` and
``unprepared``.

The statements are those cyclone sends: captured through SQLAlchemy's cursor events
(bench/capture.py), or the workflow's compiled new-key statement from ``wf.plan()``.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import cyclone
from bench import capture, db, workloads


def new_key_statement() -> tuple[str, dict[str, Any]]:
    """The SQL ``submit_once`` sends for a new key of the 1-step workflow, and its
    parameters but ``key`` and ``input`` (no deadline, retention, delay or trace)."""
    wf = workloads.one_step
    compiled = wf.plan().fast_insert_run_once
    params = {**compiled.defaults, "workflow": wf.name, "deadline_at": None}
    params |= {"deadline_in": None, "retention": None, "start_at": None, "start_in": None}
    return compiled.sql, params | {"trace_context": None}


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
        with psycopg.connect(db.conninfo(engine.url)) as driver:
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


def _one_state_check(conn: Any) -> None:
    conn.execute(
        "ALTER TABLE cyclone_runs DROP CONSTRAINT ck_cyclone_runs_state, "
        "DROP CONSTRAINT ck_cyclone_runs_finalized_at, "
        "ADD CONSTRAINT ck_cyclone_runs_state CHECK (CASE WHEN state = 'running' "
        "THEN finalized_at IS NULL ELSE state IN ('cancelled', 'completed', 'failed') "
        "AND finalized_at IS NOT NULL END)"
    )


_RING_WITHOUT_MEMO = """
CREATE OR REPLACE FUNCTION cyclone_ring() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pg_advisory_xact_lock_shared(1668899692, pg_backend_pid() % 64);
        IF NOT EXISTS (SELECT FROM cyclone_waiters WHERE waits_until > now()) THEN
            RETURN false;
        END IF;
    END IF;
    PERFORM pg_notify('cyclone_jobs_available', '');
    RETURN true;
END $$
"""


_VARIANTS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "cyclone": ("the schema and statement as shipped", lambda c: None),
    "no ring": ("without cyclone_ring() (NOTIFY when a worker waits)", lambda c: None),
    "ring by try-lock": (
        "cyclone_ring() replaced by one pg_try_advisory_xact_lock (a design not adopted)",
        lambda c: None,
    ),
    "no checks": ("without the CHECK constraints of the runs table", _drop_checks),
    "one state check": (
        "the runs' state and finalized_at checks as one CASE (a design not adopted)",
        _one_state_check,
    ),
    "ring without memo": (
        "cyclone_ring() remembering nothing, not even that it rang (a design not adopted)",
        lambda c: c.execute(_RING_WITHOUT_MEMO),
    ),
    "no listing indexes": (
        "without the runs' two listing indexes",
        lambda c: c.execute(
            "DROP INDEX ix_cyclone_runs_listing_state, ix_cyclone_runs_listing_workflow_state"
        ),
    ),
    "no start index": (
        "without the index of the runs to start",
        lambda c: c.execute("DROP INDEX ix_cyclone_runs_start"),
    ),
}


_TRY_LOCK_RING = (
    "(SELECT CASE WHEN pg_try_advisory_xact_lock(1668899692, pg_backend_pid() %% 64) "
    "THEN false ELSE pg_notify('cyclone_jobs_available', '') IS NOT NULL END)"
)


def _backend_cpu(pid: int) -> int | None:
    """Nanoseconds of CPU the server process ``pid`` has used, if it runs on this machine."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def parts(url: str, n: int) -> None:
    """What the new-key and existing-key statement costs on the server, part by part.

    Each variant lives in its own database (cyclone's schema, then one change) and has
    its own connection; each round calls every variant and the raw baseline once, in a
    new random order, so a swing of the VM's commit latency hits all of them alike.
    Times are per call from the client, medians; "server" is the CPU time the variant's
    backend used per new key (``/proc/<pid>/schedstat``, when the server runs on this
    machine and its processes are readable).
    """
    admin = make_url(url)
    plan = workloads.one_step.plan()
    full = plan.fast_insert_run_once.sql
    ring = "(SELECT cyclone_ring() AS cyclone_ring_1)"
    if ring not in full:
        raise RuntimeError("the new-key statement no longer calls cyclone_ring(): update parts")
    silent = full.replace(ring, "NULL::boolean")
    # A ring that asks a lock, not the waiters table, whether a worker waits: where a
    # waiter would hold the slot's lock shared, the try fails and the statement notifies.
    locked = full.replace(ring, _TRY_LOCK_RING)
    created: list[Any] = []
    conns: dict[str, tuple[psycopg.Connection[Any], str | None]] = {}
    try:
        for label, (_what, change) in _VARIANTS.items():
            made = db.create_database(admin)
            created.append(made)
            db.install(made)
            c = psycopg.connect(db.conninfo(made), autocommit=True)
            change(c)
            conns[label] = (c, {"no ring": silent, "ring by try-lock": locked}.get(label, full))
        # The baseline gets a connection of its own: a backend that ran the previous call
        # is warmer, so sharing one, or a fixed order, favours one side.
        conns["raw psycopg"] = (psycopg.connect(db.conninfo(created[0]), autocommit=True), None)
        params = {"input": json.dumps(workloads.payload(1)), "deadline_at": None}
        params |= {"deadline_in": None, "retention": None}
        params |= {"start_at": None, "start_in": None, "trace_context": None}

        def call(c: psycopg.Connection[Any], sql: str | None, key: str) -> None:
            if sql is None:
                c.execute(workloads.RAW_INSERT_OR_SELECT, {**params, "wf": "w", "key": key})
            else:
                c.execute(sql, {**params, "key": key})

        results: dict[str, dict[str, float]] = defaultdict(dict)
        pids = {label: c.info.backend_pid for label, (c, _sql) in conns.items()}
        server: dict[str, float] = defaultdict(float)
        for phase in ("new key", "existing key"):
            samples: dict[str, list[float]] = defaultdict(list)
            order = list(conns)
            for i in range(n):
                random.shuffle(order)
                for label in order:
                    c, sql = conns[label]
                    cpu0 = _backend_cpu(pids[label])
                    t0 = time.perf_counter()
                    call(c, sql, f"k{i}")
                    samples[label].append(time.perf_counter() - t0)
                    if phase == "new key" and cpu0 is not None:
                        server[label] += (_backend_cpu(pids[label]) or cpu0) - cpu0
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
        head = f"{'variant':<26} {'new key':>8} {'existing':>9} {'server':>7} {'WAL B/new':>10}"
        print(head + "  what")
        for label in conns:
            by = results[label]
            what = _VARIANTS[label][0] if label in _VARIANTS else "one INSERT ... ON CONFLICT"
            cpu = f"{server[label] / n / 1000:7.0f}" if label in server else f"{'-':>7}"
            print(
                f"{label:<26} {by['new key']:8.0f} {by['existing key']:9.0f} {cpu} "
                f"{wal[label]:10.0f}  {what}"
            )
        for c, _sql in conns.values():
            c.close()
    finally:
        for made in created:
            db.drop_database(admin, made)


def unprepared(engine: sa.Engine, n: int) -> None:
    """Figure k's gap: a new key's statement with and without a server-side prepared plan.

    Behind PgBouncer in transaction mode the driver cannot prepare, so the server parses
    and plans every call. Raw's insert and cyclone's new-key statement, each prepared and
    unprepared on one direct connection, interleaved call by call (medians, us per call);
    then the planning time PostgreSQL reports for each (``EXPLAIN (ANALYZE, SUMMARY)``,
    medians of 50, rolled back).
    """
    stmt, params = new_key_statement()
    samples: dict[str, list[float]] = defaultdict(list)
    with psycopg.connect(db.conninfo(engine.url), autocommit=True) as conn:
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
