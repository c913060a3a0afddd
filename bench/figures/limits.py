"""Flow control figures: jobs/s through a limited step kind vs an unlimited one (1 and 2
worker processes), and the time per job of a limited kind with 10,000 keys waiting.

Run by hand: ``python -m bench.figures.limits`` (a throwaway database on the server of
``CYCLONE_DATABASE_URL``). The limit is not the bottleneck: ``Concurrency(1000)`` on one
key, so the figure is the cost of the limited claim itself.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import uuid
from multiprocessing import get_context
from typing import Any

import sqlalchemy as sa

import cyclone

JOBS = 3000


def _kind(limited: bool, keys: bool = False) -> cyclone.StandaloneStep[Any, Any]:
    conc = cyclone.Concurrency(1000, key=(lambda a: str(a["k"])) if keys else None)
    kw: dict[str, Any] = {"concurrency": conc} if limited else {}

    def noop(ctx: cyclone.StepContext, args: Any) -> None:
        return None

    return cyclone.step("bench.limited" if limited else "bench.free", **kw)(noop)


def _drain(url: str, limited: bool) -> None:
    engine = sa.create_engine(url)
    with cyclone.Worker(engine, steps=[_kind(limited)], concurrency=8, sweep=False) as w:
        w.drain()
    engine.dispose()


def _throughput(url: str, limited: bool, procs: int) -> float:
    engine = sa.create_engine(url)
    step = _kind(limited)
    with engine.begin() as conn:
        for i in range(JOBS):
            step.enqueue_tx(conn, {"k": i % 10})
    engine.dispose()
    ctx = get_context("spawn")
    started = time.perf_counter()
    workers = [ctx.Process(target=_drain, args=(url, limited)) for _ in range(procs)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
    return JOBS / (time.perf_counter() - started)


def _claim_cost(url: str, keys: int = 10_000, sample: int = 2_000) -> float:
    """Mean ms per job while ``keys`` keys wait (all with room): one worker runs the first
    ``sample`` jobs of a limited kind whose every job has its own key, timed from the
    worker's log lines of the first and the last; the steps do nothing, so the claims and
    records are the cost."""
    engine = sa.create_engine(url)
    step = _kind(True, keys=True)
    with engine.begin() as conn:
        for i in range(keys):
            step.enqueue_tx(conn, {"k": i})
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE cyclone_jobs, cyclone_limit_keys")
    finished: list[float] = []
    worker = cyclone.Worker(engine, steps=[step], concurrency=8, sweep=False)

    class _Finished(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if getattr(record, "outcome", None) == "completed":
                finished.append(time.perf_counter())
                if len(finished) >= sample:
                    worker.stop()

    handler = _Finished()
    log = logging.getLogger("cyclone.worker")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        worker.run()
    finally:
        log.removeHandler(handler)
        worker.close()
        engine.dispose()
    return (finished[-1] - finished[0]) * 1000 / (len(finished) - 1)


def main() -> None:
    admin = sa.create_engine(
        os.environ.get("CYCLONE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres"),
        isolation_level="AUTOCOMMIT",
    )
    results: dict[str, float] = {}
    for what in ("free-1", "limited-1", "free-2", "limited-2", "claim-10k"):
        db = f"cyclone_bench_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {db}")
        url = admin.url.set(database=db).render_as_string(hide_password=False)
        try:
            engine = sa.create_engine(url)
            cyclone.upgrade(engine)
            engine.dispose()
            if what == "claim-10k":
                results[what] = _claim_cost(url)
            else:
                kind, count = what.split("-")
                results[what] = _throughput(url, kind == "limited", int(count))
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f"DROP DATABASE {db} WITH (FORCE)")
        print(f"{what}: {results[what]:.1f}", file=sys.stderr, flush=True)
    for procs in (1, 2):
        ratio = results[f"limited-{procs}"] / results[f"free-{procs}"]
        print(
            f"{procs} process(es): unlimited {results[f'free-{procs}']:.0f} jobs/s, "
            f"limited {results[f'limited-{procs}']:.0f} jobs/s ({ratio:.2f}x)"
        )
    print(f"limited kind, 10,000 keys waiting: {results['claim-10k']:.2f} ms per job (mean)")


if __name__ == "__main__":
    main()
