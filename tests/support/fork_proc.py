"""Subprocess entry point: fork one run onto the fixed three-step workflow.

Usage: ``python -m tests.support.fork_proc WORKFLOW RUN_ID KEY``. The database URL comes
from ``CYCLONE_TEST_DATABASE_URL``. Prints one JSON line: ``{"run_id": ..., "created": ...}``.
The tests kill it while its fork waits for a lock they hold.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import sqlalchemy as sa

from tests.support.fork_defs import three_steps

APPLICATION_NAME = "cyclone-test-fork-proc"
"""The application name of the subprocess's sessions, which the tests look for."""


def main(argv: list[str]) -> int:
    name, run_id, key = argv
    engine = sa.create_engine(
        os.environ["CYCLONE_TEST_DATABASE_URL"],
        pool_size=1,
        connect_args={"application_name": APPLICATION_NAME},
    )
    fixed = three_steps(name, Counter(), fixed=True)
    fork, created = fixed.run(engine, run_id).fork(key, rerun=["label"])
    print(json.dumps({"run_id": str(fork.id), "created": created}), flush=True)
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
