"""Subprocess entry point: wait at an advisory-lock start gate, then submit_once one key.

Usage: ``python -m tests.support.submit_proc WORKFLOW KEY GATE``. The database URL comes
from ``CYCLONE_TEST_DATABASE_URL``. Prints one JSON line: ``{"run_id": ..., "created": ...}``.
"""

from __future__ import annotations

import json
import os
import sys

import sqlalchemy as sa

from tests.support.factories import workflow


def main(argv: list[str]) -> int:
    name, key, gate = argv[0], argv[1], int(argv[2])
    engine = sa.create_engine(os.environ["CYCLONE_TEST_DATABASE_URL"], pool_size=1)
    wf = workflow(name, 3)
    wf.plan()
    with engine.connect() as conn:
        # Blocks while the test holds the exclusive lock; every child passes at once.
        conn.execute(sa.text("SELECT pg_advisory_lock_shared(:k)"), {"k": gate})
        conn.execute(sa.text("SELECT pg_advisory_unlock_shared(:k)"), {"k": gate})
        conn.commit()
    # The pool hands the same, already open connection to submit_once.
    run, created = wf.submit_once(engine, key, {"key": key})
    print(json.dumps({"run_id": str(run.id), "created": created}), flush=True)
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
