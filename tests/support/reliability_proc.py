"""The reliability suite's workflow, and its worker process.

``python -m tests.support.reliability_proc URL`` serves :data:`WORKFLOW` with
``Worker.run()`` until SIGTERM (or SIGKILL from the test). The workflow is a diamond,
``split -> (left, right) -> join``; every step execution first writes a row to
``executions`` (autocommit, before the step's outcome is recorded), so the test can
count how many times each step ran, and returns a value derived from the input so the
test can check every output.
"""

from __future__ import annotations

import os
import random
import sys
import time
from datetime import timedelta
from functools import cache

import msgspec
import psycopg
import sqlalchemy as sa

import cyclone

NAME = "reliability"
HEARTBEAT = timedelta(milliseconds=200)
RESCUE_AFTER = timedelta(seconds=1)
EXECUTIONS_DDL = (
    "CREATE TABLE IF NOT EXISTS executions "
    "(run_id uuid NOT NULL, step text NOT NULL, pid integer NOT NULL, at timestamptz DEFAULT now())"
)


class Order(msgspec.Struct):
    n: int
    pause: float = 0.0


WORKFLOW: cyclone.ResultWorkflow[Order, int] = cyclone.ResultWorkflow(NAME, input=Order, output=int)


@cache
def _recorder() -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(os.environ["CYCLONE_RELIABILITY_DSN"], autocommit=True)


def _executed(ctx: cyclone.StepContext, pause: float) -> None:
    """Note this execution (retrying through a restart), then spend ``pause`` seconds."""
    for _ in range(200):
        try:
            _recorder().execute(
                "INSERT INTO executions (run_id, step, pid) VALUES (%s, %s, %s)",
                (ctx.run_id, ctx.step, os.getpid()),
            )
            break
        except psycopg.OperationalError:
            _recorder.cache_clear()
            time.sleep(0.1)  # a pause before retrying through a restart
    else:
        raise RuntimeError("could not note the execution")
    if pause:
        time.sleep(random.uniform(0, pause))  # the step's work


@WORKFLOW.step()
def split(ctx: cyclone.StepContext, order: Order) -> int:
    _executed(ctx, order.pause)
    return order.n * 2


@WORKFLOW.step(after=[split])
def left(ctx: cyclone.StepContext, order: Order) -> int:
    _executed(ctx, order.pause)
    return ctx.output(split) + 1


@WORKFLOW.step(after=[split])
def right(ctx: cyclone.StepContext, order: Order) -> int:
    _executed(ctx, order.pause)
    return ctx.output(split) + 2


@WORKFLOW.result(after=[left, right])
def join(ctx: cyclone.StepContext, order: Order) -> int:
    _executed(ctx, order.pause)
    return ctx.output(left) + ctx.output(right)


def expected_outputs(n: int) -> dict[str, int]:
    """Each step's output for ``Order(n=n)``."""
    return {"split": 2 * n, "left": 2 * n + 1, "right": 2 * n + 2, "join": 4 * n + 3}


def worker(engine: sa.Engine) -> cyclone.Worker:
    return cyclone.Worker(
        engine,
        workflows=[WORKFLOW],
        concurrency=4,
        poll_interval=0.5,
        heartbeat_interval=HEARTBEAT,
        rescue_after=RESCUE_AFTER,
    )


def main(url: str) -> None:
    engine = sa.create_engine(url, pool_size=6, pool_pre_ping=True)
    worker(engine).run()


if __name__ == "__main__":
    main(sys.argv[1])
