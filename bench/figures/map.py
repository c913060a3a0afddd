"""Fan-out figure: a map over 10,000 items, expanded and run by 1 and 2 worker processes.

Run by hand: ``python -m bench.figures.map`` (a throwaway database per measurement on the
server of ``CYCLONE_DATABASE_URL``). The items do nothing, so the figure is cyclone's cost
per item: its claim, its record and the count down of its run and map node.

Printed per number of worker processes (8 threads each): the time from the submit to the
result (``run.result()``), items/s over that time, and the time to expand, from the
completion of the step that returns the list to the first item's completion (both read
from the workers' log lines). Then, with one worker in this process on a counting engine,
the statements sent for the whole run, and how many of them made the items (one, whatever
the length of the list).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from multiprocessing import get_context
from multiprocessing.queues import Queue
from typing import Any

import sqlalchemy as sa

import cyclone
from bench import statements

ITEMS = 10_000
THREADS = 8


def fan_out() -> cyclone.ResultWorkflow[int, int]:
    """``numbers`` returns ``range(n)``; ``same`` maps over it; ``count`` is the result."""
    wf: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(
        "bench.map", input=int, output=int
    )

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers)
    def same(ctx: cyclone.StepContext, i: int) -> int:
        return i

    @wf.result(after=[same])
    def count(ctx: cyclone.StepContext, n: int) -> int:
        return len(ctx.output(same))

    return wf


class _Moments(logging.Handler):
    """Puts (step, perf_counter) of the first completion of each step on ``queue``."""

    def __init__(self, queue: Queue[tuple[str, float]]) -> None:
        super().__init__()
        self.queue = queue
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        step = getattr(record, "step", None)
        if getattr(record, "outcome", None) == "completed" and step not in self.seen:
            self.seen.add(str(step))
            self.queue.put((str(step), time.time()))


def _serve(url: str, queue: Queue[tuple[str, float]]) -> None:
    log = logging.getLogger("cyclone.worker")
    log.addHandler(_Moments(queue))
    log.setLevel(logging.INFO)
    log.propagate = False
    engine = sa.create_engine(url, pool_size=THREADS + 4)
    with cyclone.Worker(
        engine, workflows=[fan_out()], concurrency=THREADS, sweep=False, poll_interval=0.2
    ) as worker:
        worker.run()
    engine.dispose()


def _timed(url: str, procs: int) -> tuple[float, float]:
    """(seconds from submit to result, seconds to expand) with ``procs`` worker processes."""
    ctx = get_context("spawn")
    queue: Queue[tuple[str, float]] = ctx.Queue()
    workers = [ctx.Process(target=_serve, args=(url, queue)) for _ in range(procs)]
    for p in workers:
        p.start()
    engine = sa.create_engine(url)
    try:
        time.sleep(3)  # the workers import and connect before the clock starts
        started = time.perf_counter()
        run = fan_out().submit(engine, ITEMS)
        assert run.result(timeout=1800) == ITEMS
        took = time.perf_counter() - started
    finally:
        for p in workers:
            p.terminate()
        for p in workers:
            p.join(60)
        engine.dispose()
    firsts: dict[str, float] = {}
    while not queue.empty():
        step, at = queue.get()
        firsts[step] = min(at, firsts.get(step, at))
    return took, firsts["same"] - firsts["numbers"]


def _counted(url: str) -> tuple[float, int, int]:
    """(seconds, statements, statements that made the items) for one run, one worker
    in-process."""
    engine = statements.counted_engine(sa.make_url(url), pool_size=THREADS + 4)
    wf = fan_out()
    run = wf.submit(engine, ITEMS)
    sent: list[str] = []
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=THREADS, sweep=False)
    started = time.perf_counter()
    with statements.counting(engine) as counter:
        classify = counter.on_execute

        def on_execute(statement: str) -> None:
            sent.append(statement)
            classify(statement)

        counter.on_execute = on_execute  # type: ignore[method-assign]
        worker.drain()
    took = time.perf_counter() - started
    assert run.result(timeout=60) == ITEMS
    worker.close()
    engine.dispose()
    expanding = sum(1 for s in sent if "jsonb_array_elements" in s and "map_items" in s)
    return took, len(sent), expanding


def main() -> None:
    global ITEMS
    if len(sys.argv) > 1:  # a smaller list, for a smoke run
        ITEMS = int(sys.argv[1])
    admin = sa.create_engine(
        os.environ.get("CYCLONE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres"),
        isolation_level="AUTOCOMMIT",
    )
    out: dict[str, Any] = {}
    for what in ("procs-1", "procs-2", "counted"):
        db = f"cyclone_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {db}")
        url = admin.url.set(database=db).render_as_string(hide_password=False)
        try:
            engine = sa.create_engine(url)
            cyclone.upgrade(engine)
            engine.dispose()
            out[what] = _counted(url) if what == "counted" else _timed(url, int(what[-1]))
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP DATABASE {db} WITH (FORCE)")
        print(f"{what}: {out[what]}", file=sys.stderr, flush=True)
    for procs in (1, 2):
        took, expand = out[f"procs-{procs}"]
        print(
            f"{procs} worker process(es) x {THREADS} threads: {ITEMS:,} items in {took:.1f} s "
            f"({ITEMS / took:.0f} items/s), expanded in {expand * 1000:.0f} ms"
        )
    took, sent, expanding = out["counted"]
    print(
        f"1 worker in-process, counted: {took:.1f} s, {sent:,} statements "
        f"({sent / ITEMS:.2f} per item), {expanding} of them made the {ITEMS:,} items"
    )
    admin.dispose()


if __name__ == "__main__":
    main()
