"""Standalone jobs under real concurrency: unique keys enqueued at once, claims at once."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa

import cyclone
from cyclone.schema import jobs
from tests.conftest import wait_until
from tests.support import processes

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = 8


def waiting_on_gate(engine: sa.Engine, gate: int) -> int:
    with engine.connect() as c:
        return int(
            c.execute(
                sa.text(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND classid = 0 AND objid = :k AND objsubid = 1 AND NOT granted"
                ),
                {"k": gate},
            ).scalar_one()
        )


@pytest.mark.processes
def test_one_of_many_processes_enqueuing_one_unique_key_at_once_wins(
    engine: sa.Engine, name: str
) -> None:
    gate = random.randrange(1, 2**31)
    key = f"{name}:once"
    with engine.connect() as holder:
        holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": gate})
        holder.commit()
        procs = [
            processes.popen(
                [sys.executable, "-m", "tests.support.enqueue_proc", name, key, str(gate)],
                cwd=ROOT,
                env={**os.environ},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(PROCESSES)
        ]
        try:
            wait_until(lambda: waiting_on_gate(engine, gate) == PROCESSES, timeout=30)
        finally:
            holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": gate})
            holder.commit()
        outputs = [p.communicate(timeout=30) for p in procs]

    assert [p.returncode for p in procs] == [0] * PROCESSES, [err for _, err in outputs]
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    winners = [r["job_id"] for r in results if "job_id" in r]
    losers = [r for r in results if "duplicate" in r]
    assert len(winners) == 1
    assert len(losers) == PROCESSES - 1
    assert all(r == {"duplicate": winners[0], "kind": name, "key": key} for r in losers)
    with engine.connect() as c:
        rows = c.execute(sa.select(jobs.c.id, jobs.c.unique_key).where(jobs.c.kind == name)).all()
    assert [tuple(r) for r in rows] == [(winners[0], key)]


def test_workers_serving_several_kinds_at_once_run_every_job_exactly_once(
    engine: sa.Engine, name: str
) -> None:
    # Three workers in threads, each on its own connections, claim from the same two
    # kinds at once: the merged multi-kind claim must never hand one job to two of them.
    ran: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()

    def kind(suffix: str) -> cyclone.StandaloneStep[int, None]:
        @cyclone.step(f"{name}.{suffix}")
        def record(ctx: cyclone.StepContext, n: int) -> None:
            with lock:
                ran[(suffix, n)] += 1

        return record

    a, b = kind("a"), kind("b")
    per_kind = 300
    with engine.begin() as conn:
        for step in (a, b):
            for n in range(per_kind):
                step.enqueue_tx(conn, n, priority=n % 3)
    start = threading.Barrier(3)
    counts: list[int] = []

    def drain() -> None:
        worker = cyclone.Worker(engine, steps=[a, b], concurrency=2, sweep=False)
        start.wait(timeout=10)
        counts.append(worker.drain())

    threads = [threading.Thread(target=drain) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(counts) == 2 * per_kind
    assert set(ran.values()) == {1}
    assert len(ran) == 2 * per_kind
    with engine.connect() as conn:
        states = conn.execute(
            sa.select(jobs.c.state, jobs.c.attempt, sa.func.count())
            .where(jobs.c.kind.in_([f"{name}.a", f"{name}.b"]))
            .group_by(jobs.c.state, jobs.c.attempt)
        ).all()
    assert states == [("completed", 1, 2 * per_kind)]
