"""``bench.profile writes``: what the server writes per workflow step and per raw job.

A one-process drain of 3-step runs (figure d's workflow) and raw's SKIP LOCKED loop over
as many no-op jobs, each measured by the WAL it wrote (``pg_current_wal_lsn``), the row
versions of each table (``pg_stat_user_tables``) and, when ``pg_waldump`` can read the
server's WAL directory (a local server, run as root or postgres), its records by kind:
index entries per index, row locks, updates and inserts. Deterministic where the timed
figures swing with the machine: it says how much work a step is, not how fast it went.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import psycopg
import sqlalchemy as sa

import cyclone
from bench import db, workloads

ROW_COUNTS = (
    "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
    "WHERE relname IN ('cyclone_jobs', 'cyclone_runs', 'raw_jobs') ORDER BY relname"
)


def writes(engine: sa.Engine, n: int) -> None:
    """Drain ``n`` workflow steps (``n // 3`` runs) and ``n`` raw jobs; print their writes."""
    runs = max(1, n // 3)
    items = [(f"w{i}", workloads.payload(i)) for i in range(runs)]
    for start in range(0, runs, 1000):
        workloads.three_step.submit_once_many(engine, items[start : start + 1000])
    db.enqueue_raw_noops(engine.url, runs * 3)
    db.analyze(engine.url)
    dsn = db.conninfo(engine.url)
    worker = cyclone.Worker(engine, workflows=[workloads.three_step], sweep=False)
    with _Writes(dsn, "workflow steps") as w:
        w.done = worker.drain()
    with _Writes(dsn, "raw jobs") as w, psycopg.connect(dsn, autocommit=True) as conn:
        while rows := conn.execute(workloads.RAW_CLAIM, (10,)).fetchall():
            conn.execute(workloads.RAW_COMPLETE, ([r[0] for r in rows],))
            w.done += len(rows)


class _Writes:
    """The WAL and row versions written between entering and leaving, per ``done`` unit."""

    def __init__(self, dsn: str, what: str) -> None:
        self.dsn = dsn
        self.what = what
        self.done = 0

    def __enter__(self) -> _Writes:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self.start = str(_one(conn, "SELECT pg_current_wal_lsn()"))
            self.rows = {r[0]: r[1:] for r in conn.execute(ROW_COUNTS)}
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is not None:
            return
        per = max(1, self.done)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            end = str(_one(conn, "SELECT pg_current_wal_lsn()"))
            wal = int(str(_one(conn, f"SELECT pg_wal_lsn_diff('{end}', '{self.start}')")))
            print(f"{self.what}: {self.done:,}; WAL {wal / per:,.0f} bytes each")
            # PostgreSQL 15's backends report their row counts at most once a second.
            time.sleep(1.5)
            for name, *after in conn.execute(ROW_COUNTS):
                before = self.rows.get(name, (0, 0, 0))
                ins, upd, hot = (a - b for a, b in zip(after, before, strict=True))
                if ins or upd:
                    print(
                        f"  {name}: inserts {ins / per:.2f}, updates {upd / per:.2f} "
                        f"({hot / per:.2f} HOT) each"
                    )
            records = _waldump(conn, self.start, end)
            if records is None:
                print("  (pg_waldump could not read the WAL: run on the server's machine as root)")
                return
            names: dict[str, str] = {
                str(r[0]): str(r[1])
                for r in conn.execute("SELECT relfilenode::text, relname FROM pg_class")
            }
        kinds = Counter(kind for kind, _ in records)
        for kind in ("Heap/INSERT", "Heap/UPDATE", "Heap/HOT_UPDATE", "Heap/LOCK"):
            print(f"  WAL {kind}: {kinds[kind] / per:.2f} each")
        leaves = Counter(
            names.get(rel, rel) for kind, rel in records if kind == "Btree/INSERT_LEAF"
        )
        print(f"  index entries: {sum(leaves.values()) / per:.2f} each")
        for index, count in leaves.most_common():
            print(f"    {index}: {count / per:.2f}")
        locked = Counter(names.get(rel, rel) for kind, rel in records if kind == "Heap/LOCK")
        for table, count in locked.most_common():
            print(f"  row-lock records on {table}: {count / per:.2f} each")


def _one(conn: psycopg.Connection[tuple[object, ...]], sql: str) -> object:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0]


def _waldump(
    conn: psycopg.Connection[tuple[object, ...]], start: str, end: str
) -> list[tuple[str, str]] | None:
    """The WAL records between ``start`` and ``end``: (rmgr/kind, relfilenode), or None."""
    version = str(_one(conn, "SHOW server_version_num"))
    directory = Path(str(_one(conn, "SHOW data_directory"))) / "pg_wal"
    major = int(version) // 10000
    tool = shutil.which("pg_waldump") or f"/usr/lib/postgresql/{major}/bin/pg_waldump"
    if not Path(tool).exists() or not directory.is_dir():
        return None
    done = subprocess.run(
        [tool, "-p", str(directory), "-s", start, "-e", end],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 and not done.stdout:
        return None
    records = []
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) < 2 or "desc:" not in parts:
            continue
        rmgr = parts[1]
        kind = parts[parts.index("desc:") + 1]
        rel = ""
        if "rel" in parts:
            rel = parts[parts.index("rel") + 1].rsplit("/", 1)[-1]
        records.append((f"{rmgr}/{kind}", rel))
    return records
