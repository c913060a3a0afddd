"""Subprocess entry point: wait at a start gate, then enqueue one unique job; print JSON.

Usage: ``python -m tests.support.enqueue_proc KIND KEY GATE``. The test holds
``pg_advisory_lock(GATE)``; this process blocks on ``pg_advisory_lock_shared(GATE)`` and
enqueues the moment the test releases it. It prints one JSON line: ``{"job_id": ...}`` when
it won, or ``{"duplicate": ..., "kind": ..., "key": ...}`` when an active job held the key.
"""

from __future__ import annotations

import json
import os
import sys

import sqlalchemy as sa

import cyclone


def main(kind: str, key: str, gate: int) -> None:
    engine = sa.create_engine(os.environ["CYCLONE_TEST_DATABASE_URL"], pool_size=2)

    @cyclone.step(kind)
    def noop(ctx: cyclone.StepContext, args: dict[str, int]) -> None:
        return None

    with engine.connect() as warm:  # open the pooled connection before the gate
        warm.execute(sa.select(1))
    with engine.connect() as gate_conn:
        gate_conn.execute(sa.text("SELECT pg_advisory_lock_shared(:k)"), {"k": gate})
        try:
            job = noop.enqueue(engine, {"pid": os.getpid()}, unique=key)
            out: dict[str, object] = {"job_id": job.id}
        except cyclone.DuplicateError as err:
            out = {"duplicate": err.job_id, "kind": err.kind, "key": err.key}
        gate_conn.execute(sa.text("SELECT pg_advisory_unlock_shared(:k)"), {"k": gate})
        gate_conn.commit()
    print(json.dumps(out), flush=True)
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
