"""Statements and transactions per operation, counted at the driver.

The counting engines use a psycopg cursor class that reports every statement it executes
(a SQLAlchemy cursor-event listener would move cyclone off its fast path, onto a
``Connection``, and so change what is measured); transactions are SQLAlchemy's
``commit`` events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from bench import db, workloads

if TYPE_CHECKING:
    from bench.harness import Bench

_COUNTERS: list[StatementCounter] = []


class CountingCursor(psycopg.Cursor[Any]):
    """Reports each statement to the active counters: cyclone's fast path sends statements
    on the driver connection, where SQLAlchemy's cursor events do not see them."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else str(query)
        if not text.lstrip().upper().startswith("LISTEN"):
            for counter in list(_COUNTERS):
                counter.on_execute(text)
        return super().execute(query, params, **kwargs)


def counted_engine(url: URL, **kw: Any) -> sa.Engine:
    """An engine whose statements the active :func:`counting` blocks count."""
    return sa.create_engine(url, connect_args={"cursor_factory": CountingCursor}, **kw)


class StatementCounter:
    """Counts statements (by what they do, at the driver) and transactions (SQLAlchemy's)."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.begins = 0
        self.commits = 0

    def on_execute(self, statement: str) -> None:
        self.kinds[classify(statement)] += 1

    def on_begin(self, conn: Any) -> None:
        self.begins += 1

    def on_commit(self, conn: Any) -> None:
        self.commits += 1

    def per(self, n: int) -> dict[str, float]:
        out = {"statements": sum(self.kinds.values()) / n, "transactions": self.commits / n}
        out.update({f"  {k}": v / n for k, v in sorted(self.kinds.items())})
        return out


@contextmanager
def counting(engine: sa.Engine) -> Iterator[StatementCounter]:
    """Count what ``engine`` (a :func:`counted_engine`) sends during the block."""
    counter = StatementCounter()
    sa.event.listen(engine, "begin", counter.on_begin)
    sa.event.listen(engine, "commit", counter.on_commit)
    _COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)
        sa.event.remove(engine, "begin", counter.on_begin)
        sa.event.remove(engine, "commit", counter.on_commit)


def classify(statement: str) -> str:
    """What a statement cyclone sent does, from its text."""
    s = " ".join(statement.split())
    if "SKIP LOCKED" in s and "jsonb_to_recordset" in s:
        return "record+claim"
    if "SKIP LOCKED" in s and "UPDATE cyclone_jobs" in s:
        return "claim"
    if "UPDATE cyclone_jobs" in s and "jsonb_to_recordset" in s:
        return "complete"
    if "INSERT INTO cyclone_runs" in s:
        return "insert run"
    if s.startswith("SELECT") and "cyclone_runs" in s:
        return "read run"
    if "heartbeat_at=now()" in s.replace(" ", "") and "rescue" not in s:
        return "heartbeat/rescue/expire"
    if "cyclone_runs" in s and "deadline" in s:
        return "heartbeat/rescue/expire"
    return "other"


def count_statements(bench: Bench) -> None:
    """Statements per submit (new key, existing key, batch) and per drained job and step."""
    one, five = workloads.one_step, workloads.five_step
    n = 50
    for i in range(5):
        one.submit_once(bench.counted, f"st-w{i}", workloads.payload(i))
    with counting(bench.counted) as c:
        for i in range(n):
            one.submit_once(bench.counted, f"st-{i}", workloads.payload(i))
    bench.statements["submit_once, new key (1-step)"] = c.per(n)
    with counting(bench.counted) as c:
        for i in range(n):
            five.submit_once(bench.counted, f"st-{i}", workloads.payload(i))
    bench.statements["submit_once, new key (5-step)"] = c.per(n)
    with counting(bench.counted) as c:
        for i in range(n):
            one.submit_once(bench.counted, f"st-{i}", workloads.payload(i))
    bench.statements["submit_once, existing key"] = c.per(n)
    items = [(f"stm-{i}", workloads.payload(i)) for i in range(1000)]
    with counting(bench.counted) as c:
        one.submit_once_many(bench.counted, items)
    bench.statements["submit_once_many, batch of 1,000 (per batch)"] = c.per(1)
    # The worker, in this process: standalone jobs, then 3-step workflow runs.
    db.enqueue_noops(bench.dsn, 200)
    engine = counted_engine(bench.url, pool_size=bench.concurrency + 2)
    worker = cyclone.Worker(
        engine, steps=[workloads.noop], concurrency=bench.concurrency, sweep=False
    )
    with counting(engine) as c:
        ran = worker.drain()
    bench.statements[f"worker drain, per no-op job ({ran} jobs)"] = c.per(ran)
    workloads.three_step.submit_once_many(
        bench.engine, [(f"stw-{i}", workloads.payload(i)) for i in range(100)]
    )
    worker = cyclone.Worker(
        engine, workflows=[workloads.three_step], concurrency=bench.concurrency, sweep=False
    )
    with counting(engine) as c:
        ran = worker.drain()
    bench.statements[f"worker drain, per workflow step ({ran} steps)"] = c.per(ran)
    engine.dispose()
