"""Unique standalone keys under real concurrency: many processes enqueue one key at once."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from cyclone.schema import jobs
from tests.conftest import wait_until

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
            subprocess.Popen(
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
