"""A nightly report on a cron schedule, and a heartbeat every two seconds.

Run it with ``CYCLONE_DATABASE_URL=postgresql+psycopg://... python examples/nightly_report.py``
(cron schedules need ``pip install 'cyclone[cron]'``).

Any number of workers serving ``reports`` may run: each tick is
``submit_once(f"schedule:{name}:{tick}")``, so a tick makes one run, however many
workers fire it. The script starts a worker, waits for a heartbeat tick to run, shows
the registered schedules with their next tick, pauses and resumes the nightly one.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import sqlalchemy as sa

import cyclone

URL = os.environ.get(
    "CYCLONE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
engine = sa.create_engine(URL)

reports = cyclone.Workflow("example-reports", input=dict)


@reports.step()
def build(ctx: cyclone.StepContext, params: dict[str, str]) -> str:
    return f"report for {params['day']}"


reports.schedule(
    "example-nightly-report",
    cron="0 3 * * *",
    timezone="Europe/Berlin",
    input=lambda tick: {"day": tick.date().isoformat()},
    missed="catch_up",
    max_catch_up=3,
)
reports.schedule(
    "example-heartbeat",
    every=timedelta(seconds=2),
    input=lambda tick: {"day": tick.isoformat()},
)


def main() -> None:
    cyclone.upgrade(engine)
    client = cyclone.Client(engine)
    worker = cyclone.Worker(engine, workflows=[reports], poll_interval=1)
    serving = threading.Thread(target=worker.run)
    serving.start()
    try:
        done = threading.Event()
        while not done.wait(0.2):
            listed = {s.name: s for s in client.list_schedules()}
            heartbeat = listed.get("example-heartbeat")
            if heartbeat is None:
                continue
            key = f"schedule:example-heartbeat:{heartbeat.last_tick:%Y-%m-%dT%H:%M:%SZ}"
            run = reports.get_run(engine, key)
            if run is not None and run.wait(timeout=30).state == cyclone.RunState.COMPLETED:
                print(f"{key} completed")
                done.set()
        for schedule in client.list_schedules():
            if schedule.name.startswith("example-"):
                print(f"{schedule.name}: next tick {schedule.next_tick}, paused={schedule.paused}")
        client.pause_schedule("example-nightly-report")
        client.resume_schedule("example-nightly-report")
    finally:
        worker.stop()
        serving.join()
        engine.dispose()


if __name__ == "__main__":
    main()
