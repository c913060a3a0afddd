"""A worker process for the tests: ``python -m tests.support.worker_proc MODE NAME ARG``.

The workflows are defined here at module level (by name), so the test process submits
with the same definitions the children run. The database URL comes from the environment
variable ``CYCLONE_TEST_DATABASE_URL`` that the session fixture sets.

Modes:

- ``drain NAME GATE``: wait at the start gate (``pg_advisory_lock_shared(GATE)``, held
  exclusively by the test), drain :func:`pipeline` and print ``{"pid", "jobs"}`` as JSON.
- ``crash NAME FLAG``: ``Worker.run()`` on :func:`crashy` with ``rescue_after`` of
  :data:`CRASH_RESCUE_AFTER`; its step creates the file FLAG and blocks forever, waiting
  for the test to ``SIGKILL`` the process.
- ``serve NAME LOCK``: ``Worker.run()`` on :func:`gated` with concurrency 1, until
  SIGTERM; its step waits for ``pg_advisory_lock(LOCK)``, which the test holds.
- ``grace NAME LOCK,GRACE``: as ``serve``, with ``Worker.run(grace=GRACE)``; prints
  ``{"pid", "handed_back"}``.
- ``ops NAME -``: ``Worker.run()`` on :func:`pipeline` with INFO logging on stderr.
- ``map NAME -``: ``Worker.run()`` on :func:`mapped` with concurrency 4, until killed: its
  items record each execution in the map results table.
- ``asleep NAME CONCURRENCY``: ``Worker.run()`` on :func:`doorbell_kinds` with a poll
  interval of an hour (:data:`NEVER_POLL`), until SIGTERM: only a NOTIFY wakes it.
- ``lead NAME FLAG``: ``Worker.run()`` on :func:`crashy` with ``rescue_after`` of
  :data:`LEAD_RESCUE_AFTER` and INFO logging on stderr, until SIGTERM: the test freezes it
  (SIGSTOP) while it leads maintenance and runs the blocked step.
- ``promise NAME FLAG``: as ``crash``, but beating every :data:`PROMISE_HEARTBEAT` and
  promising :data:`PROMISE_RESCUE_AFTER`, longer than the leader's of the test.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from datetime import timedelta
from functools import cache
from pathlib import Path

import msgspec
import sqlalchemy as sa

import cyclone

HEARTBEAT = timedelta(milliseconds=200)
LEAD_RESCUE_AFTER = timedelta(seconds=2)
CRASH_RESCUE_AFTER = timedelta(seconds=1)
"""A killed worker's jobs wait for its own ``rescue_after``: the ``crash`` worker's."""
PROMISE_HEARTBEAT = timedelta(milliseconds=1500)
PROMISE_RESCUE_AFTER = timedelta(seconds=4)


class Item(msgspec.Struct):
    n: int


class Stamp(msgspec.Struct):
    job: str
    pid: int


@cache
def engine() -> sa.Engine:
    """This process's engine on the test database; its steps' connections are checked
    before use, as an application that rides out a server restart has them."""
    return sa.create_engine(
        os.environ["CYCLONE_TEST_DATABASE_URL"], pool_size=10, pool_pre_ping=True
    )


def results_table(name: str) -> str:
    """The table where the steps of :func:`pipeline` record each execution."""
    return f"{name}_results"


def create_results_table(bind: sa.Engine, name: str) -> None:
    with bind.begin() as conn:
        conn.execute(
            sa.text(
                f'CREATE TABLE IF NOT EXISTS "{results_table(name)}" '
                "(job text PRIMARY KEY, pid integer NOT NULL)"
            )
        )


def _record(name: str, ctx: cyclone.StepContext) -> Stamp:
    """Insert one row per execution: a second execution of a job violates the primary key."""
    job = f"{ctx.run_id}:{ctx.step}"
    with engine().begin() as conn:
        conn.execute(
            sa.text(f'INSERT INTO "{results_table(name)}" (job, pid) VALUES (:job, :pid)'),
            {"job": job, "pid": os.getpid()},
        )
    return Stamp(job=job, pid=os.getpid())


def pipeline(name: str) -> cyclone.Workflow[Item]:
    """Three steps in a chain, each recording its execution in the results table."""
    wf: cyclone.Workflow[Item] = cyclone.Workflow(name, input=Item)

    @wf.step(max_attempts=1)
    def first(ctx: cyclone.StepContext, item: Item) -> Stamp:
        return _record(name, ctx)

    @wf.step(after=[first], max_attempts=1)
    def second(ctx: cyclone.StepContext, item: Item) -> Stamp:
        assert ctx.output(first).job == f"{ctx.run_id}:first"
        return _record(name, ctx)

    @wf.step(after=[second], max_attempts=1)
    def third(ctx: cyclone.StepContext, item: Item) -> Stamp:
        assert ctx.output(second).job == f"{ctx.run_id}:second"
        return _record(name, ctx)

    return wf


def crashy(name: str, flag: Path) -> cyclone.Workflow[Item]:
    """One step that, the first time, creates ``flag`` and blocks; afterwards returns n."""
    wf: cyclone.Workflow[Item] = cyclone.Workflow(name, input=Item)

    @wf.step(max_attempts=1)
    def stuck(ctx: cyclone.StepContext, item: Item) -> int:
        try:
            with flag.open("x") as f:
                f.write(str(os.getpid()))
        except FileExistsError:
            return item.n
        threading.Event().wait()  # until SIGKILL
        raise AssertionError("unreachable")

    return wf


def gated(name: str, lock: int) -> cyclone.Workflow[Item]:
    """One step that waits for the advisory lock ``lock`` (held by the test) and returns n."""
    wf: cyclone.Workflow[Item] = cyclone.Workflow(name, input=Item)

    @wf.step(max_attempts=1)
    def wait_for_lock(ctx: cyclone.StepContext, item: Item) -> int:
        with engine().connect() as conn:
            conn.execute(sa.select(sa.func.pg_advisory_lock(lock)))
            conn.execute(sa.select(sa.func.pg_advisory_unlock(lock)))
        return item.n

    return wf


def map_results_table(name: str) -> str:
    """The table where the items of :func:`mapped` record each execution (one row each)."""
    return f"{name}_items"


def create_map_results_table(bind: sa.Engine, name: str) -> None:
    with bind.begin() as conn:
        conn.execute(
            sa.text(
                f'CREATE TABLE IF NOT EXISTS "{map_results_table(name)}" '
                "(id bigserial PRIMARY KEY, item integer NOT NULL, pid integer NOT NULL)"
            )
        )


def mapped(name: str) -> cyclone.ResultWorkflow[Item, list[int]]:
    """``numbers`` returns ``range(n)``; the map node ``square`` squares each, recording
    every execution; the result is the list of squares."""
    wf: cyclone.ResultWorkflow[Item, list[int]] = cyclone.ResultWorkflow(
        name, input=Item, output=list[int]
    )

    @wf.step()
    def numbers(ctx: cyclone.StepContext, item: Item) -> list[int]:
        return list(range(item.n))

    @wf.map(over=numbers, max_attempts=3)
    def square(ctx: cyclone.StepContext, n: int) -> int:
        with engine().begin() as conn:
            conn.execute(
                sa.text(f'INSERT INTO "{map_results_table(name)}" (item, pid) VALUES (:n, :pid)'),
                {"n": n, "pid": os.getpid()},
            )
        threading.Event().wait(0.05)  # long enough to be running when a worker is killed
        return n * n

    @wf.result(after=[square])
    def squares(ctx: cyclone.StepContext, item: Item) -> list[int]:
        return ctx.output(square)

    return wf


NEVER_POLL = 3600.0
"""A poll interval no test waits for: a wake-up that a NOTIFY misses shows as a timeout."""


@cache
def doorbell_kinds(name: str) -> tuple[cyclone.Workflow[Item], cyclone.StandaloneStep[Item, int]]:
    """A two-step workflow ``name`` and a standalone kind ``NAME.ping`` whose steps take
    ``n`` milliseconds (20 or more: a worker then claims no more jobs than it has threads,
    see ``Worker._free``), and a tail step doing nothing."""
    wf: cyclone.Workflow[Item] = cyclone.Workflow(name, input=Item)

    @wf.step()
    def head(ctx: cyclone.StepContext, item: Item) -> int:
        time.sleep(item.n / 1000)  # the step's work
        return item.n

    @wf.step(after=[head])
    def tail(ctx: cyclone.StepContext, item: Item) -> int:
        return ctx.output(head)

    @cyclone.step(f"{name}.ping")
    def ping(ctx: cyclone.StepContext, item: Item) -> int:
        time.sleep(item.n / 1000)  # the step's work
        return item.n

    return wf, ping


def main(argv: list[str]) -> int:
    mode, name, arg = argv
    bind = engine()
    if mode == "drain":
        worker = cyclone.Worker(bind, workflows=[pipeline(name)], concurrency=4, sweep=False)
        with bind.connect() as conn:
            conn.execute(sa.select(sa.func.pg_advisory_lock_shared(int(arg))))
            conn.execute(sa.select(sa.func.pg_advisory_unlock_shared(int(arg))))
        jobs = worker.drain()
        print(json.dumps({"pid": os.getpid(), "jobs": jobs}), flush=True)
    elif mode == "crash":
        cyclone.Worker(
            bind,
            workflows=[crashy(name, Path(arg))],
            heartbeat_interval=HEARTBEAT,
            rescue_after=CRASH_RESCUE_AFTER,
            sweep=False,
        ).run()
    elif mode == "promise":
        cyclone.Worker(
            bind,
            workflows=[crashy(name, Path(arg))],
            heartbeat_interval=PROMISE_HEARTBEAT,
            rescue_after=PROMISE_RESCUE_AFTER,
            poll_interval=0.2,
            sweep=False,
        ).run()
    elif mode == "serve":
        cyclone.Worker(
            bind,
            workflows=[gated(name, int(arg))],
            concurrency=1,
            heartbeat_interval=HEARTBEAT,
            sweep=False,
        ).run()
        print(json.dumps({"pid": os.getpid(), "stopped": True}), flush=True)
    elif mode == "grace":
        # ARG is "LOCK,GRACE": serve the gated workflow, stop on signals within GRACE s.
        lock, grace = arg.split(",")
        worker = cyclone.Worker(
            bind,
            workflows=[gated(name, int(lock))],
            concurrency=1,
            heartbeat_interval=HEARTBEAT,
            sweep=False,
        )
        worker.run(grace=float(grace))
        print(json.dumps({"pid": os.getpid(), "handed_back": worker.stats.handed_back}), flush=True)
    elif mode == "ops":
        # Serve ``pipeline(name)`` with INFO logs on stderr, one line per record.
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        cyclone.Worker(
            bind, workflows=[pipeline(name)], heartbeat_interval=HEARTBEAT, poll_interval=0.2
        ).run(grace=5)
    elif mode == "map":
        cyclone.Worker(
            bind,
            workflows=[mapped(name)],
            concurrency=4,
            heartbeat_interval=HEARTBEAT,
            rescue_after=LEAD_RESCUE_AFTER,
            poll_interval=0.2,
            sweep=False,
        ).run()
    elif mode == "asleep":
        wf, ping = doorbell_kinds(name)
        cyclone.Worker(
            bind,
            workflows=[wf],
            steps=[ping],
            concurrency=int(arg),
            poll_interval=NEVER_POLL,
            sweep=False,
        ).run()
    elif mode == "lead":
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        cyclone.Worker(
            bind,
            workflows=[crashy(name, Path(arg))],
            heartbeat_interval=HEARTBEAT,
            rescue_after=LEAD_RESCUE_AFTER,
            poll_interval=0.2,
            sweep=False,
        ).run()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    bind.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
