"""A worker process firing one schedule: ``python -m tests.support.schedule_proc MODE NAME DIR``.

The workflow ``NAME`` has one step and the schedule ``NAME``, every second, catching up
at most 5 missed ticks; each run's input is its tick. ``serve`` runs ``Worker.run()`` until
SIGTERM. ``victim`` does too, but its first tick's input blocks forever after creating
``DIR/victim``, so the test can ``kill -9`` it while it holds the schedule row's lock
inside an uncommitted firing transaction.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

import cyclone


def schedule_workflow(
    name: str, *, block_in: Path | None = None
) -> cyclone.Workflow[dict[str, str]]:
    wf: cyclone.Workflow[dict[str, str]] = cyclone.Workflow(name, input=dict[str, str])

    @wf.step()
    def noop(ctx: cyclone.StepContext, value: dict[str, str]) -> None:
        return None

    def tick_input(tick: datetime) -> dict[str, str]:
        if block_in is not None:
            (block_in / "victim").touch()
            threading.Event().wait()
        return {"tick": tick.isoformat()}

    wf.schedule(
        name, every=timedelta(seconds=1), input=tick_input, missed="catch_up", max_catch_up=5
    )
    return wf


def main(mode: str, name: str, directory: str) -> None:
    engine = sa.create_engine(os.environ["CYCLONE_TEST_DATABASE_URL"], pool_size=5)
    wf = schedule_workflow(name, block_in=Path(directory) if mode == "victim" else None)
    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=1, sweep=False)
    worker.run()
    engine.dispose()


if __name__ == "__main__":
    main(*sys.argv[1:4])
