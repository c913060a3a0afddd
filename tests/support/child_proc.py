"""A worker process serving the child-run tests' workflows: ``python -m
tests.support.child_proc NAME`` serves :func:`tests.support.child_defs.shop` (NAME) until
SIGTERM, with a short heartbeat and rescue so that a killed process's jobs come back soon.
The database URL comes from ``CYCLONE_TEST_DATABASE_URL``; its sessions carry
:data:`APPLICATION_NAME`, which the tests look for.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import sqlalchemy as sa

import cyclone
from tests.support.child_defs import shop

APPLICATION_NAME = "cyclone-test-child-proc"


def main(argv: list[str]) -> int:
    (name,) = argv
    engine = sa.create_engine(
        os.environ["CYCLONE_TEST_DATABASE_URL"],
        connect_args={"application_name": APPLICATION_NAME},
    )
    worker = cyclone.Worker(
        engine,
        workflows=shop(name).workflows,
        heartbeat_interval=timedelta(milliseconds=200),
        rescue_after=timedelta(seconds=1),
        sweep=False,
    )
    worker.run()
    engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
