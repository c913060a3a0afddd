"""Figures a to c: submitting. New keys one at a time (a), existing keys (b), batches (c)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg
import sqlalchemy as sa

import cyclone
from bench import measure, workloads
from bench.harness import Bench

NEW_KEY_GOAL = {"goal": 0.85, "goal_text": ">= 0.85x raw"}


def raw_new_key(conn: psycopg.Connection[Any], prefix: str) -> Callable[[int], None]:
    """Call ``i``: raw's one-statement insert of key ``prefix-i`` on ``conn``."""

    def one(i: int) -> None:
        row = conn.execute(
            workloads.RAW_INSERT_ONCE,
            ("bench_one", f"{prefix}-{i}", json.dumps(workloads.payload(i))),
        ).fetchone()
        assert row is not None

    return one


def raw_existing_key(conn: psycopg.Connection[Any], key: str, value: Any) -> None:
    """Raw's insert-or-select of a key that exists, with the same input."""
    row = conn.execute(
        workloads.RAW_INSERT_OR_SELECT, {"wf": "bench_one", "key": key, "input": json.dumps(value)}
    ).fetchone()
    assert row is not None
    assert row[1:] == (False, True)


def existing_key(wf: cyclone.Workflow[Any], engine: sa.Engine, key: str, value: Any) -> None:
    """``wf.submit_once`` of a key that exists, with the same input."""
    _run, created = wf.submit_once(engine, key, value)
    assert not created


def new_key(wf: cyclone.Workflow[Any], engine: sa.Engine, prefix: str) -> Callable[[int], None]:
    """Call ``i``: ``wf.submit_once`` of the new key ``prefix-i``."""

    def one(i: int) -> None:
        _run, created = wf.submit_once(engine, f"{prefix}-{i}", workloads.payload(i))
        assert created

    return one


def core_new_key(engine: sa.Engine, prefix: str, *, autocommit: bool) -> Callable[[int], None]:
    """Call ``i``: raw's insert through SQLAlchemy Core, in autocommit or ``engine.begin()``."""
    stmt = sa.text(
        "INSERT INTO raw_runs (workflow, submit_key, input) "
        "VALUES (:wf, :key, CAST(:input AS jsonb)) ON CONFLICT DO NOTHING RETURNING id"
    )
    if autocommit:
        engine = engine.execution_options(isolation_level="AUTOCOMMIT")

    def one(i: int) -> None:
        params = {
            "wf": "bench_one",
            "key": f"{prefix}-{i}",
            "input": json.dumps(workloads.payload(i)),
        }
        if autocommit:
            with engine.connect() as conn:
                conn.execute(stmt, params).first()
        else:
            with engine.begin() as conn:
                conn.execute(stmt, params).first()

    return one


def fig_a(bench: Bench, r: int) -> None:
    """New keys one at a time, 1-step and 5-step, beside raw's insert and two Core paths."""
    n = bench.sizes.new_keys
    raw = bench.fig("a1", "submit_once new key, 1-step", "submits/s", True, **NEW_KEY_GOAL)
    five = bench.fig("a5", "submit_once new key, 5-step", "submits/s", True, **NEW_KEY_GOAL)
    ref_auto = bench.fig("a-ref-auto", "  ref: raw SQL via Core, autocommit", "submits/s", True)
    ref_begin = bench.fig(
        "a-ref-begin", "  ref: raw SQL via Core, engine.begin()", "submits/s", True
    )
    five.raw = ref_auto.raw = ref_begin.raw = raw.raw
    with bench.raw_conn() as raw_conn:
        # Reference points (no goal): the same raw statement through SQLAlchemy Core.
        rates = measure.interleaved(
            {
                "raw": (raw_new_key(raw_conn, f"a-raw-{r}"), n),
                "one": (new_key(workloads.one_step, bench.engine, f"a1-{r}"), n),
                "five": (new_key(workloads.five_step, bench.engine, f"a5-{r}"), n),
                "auto": (core_new_key(bench.engine, f"a-auto-{r}", autocommit=True), n // 2),
                "begin": (core_new_key(bench.engine, f"a-begin-{r}", autocommit=False), n // 2),
            }
        )
    raw.raw.append(rates["raw"])
    raw.cyclone.append(rates["one"])
    five.cyclone.append(rates["five"])
    ref_auto.cyclone.append(rates["auto"])
    ref_begin.cyclone.append(rates["begin"])


def fig_b(bench: Bench, r: int) -> None:
    """Existing keys submitted again with the same input, beside raw's insert-or-select."""
    n = bench.sizes.duplicates
    f = bench.fig(
        "b",
        "submit_once existing key",
        "us/call",
        False,
        goal=1.2,
        goal_text="<= 1.2x raw",
        raw_label="raw insert-or-select CTE",
    )
    keys = [f"b-{r}-{i}" for i in range(n + measure.WARMUP)]
    inputs = [workloads.payload(i) for i in range(n + measure.WARMUP)]
    items = list(zip(keys, inputs, strict=True))
    with bench.raw_conn() as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO raw_runs (workflow, submit_key, input) VALUES (%s, %s, %s)",
                [("bench_one", k, json.dumps(v)) for k, v in items],
            )
        for start in range(0, len(items), 1000):
            workloads.one_step.submit_once_many(bench.engine, items[start : start + 1000])

        def raw(i: int) -> None:
            raw_existing_key(conn, keys[i], inputs[i])

        def once(i: int) -> None:
            existing_key(workloads.one_step, bench.engine, keys[i], inputs[i])

        rates = measure.interleaved({"raw": (raw, n), "cyclone": (once, n)})
    f.raw.append(1e6 / rates["raw"])
    f.cyclone.append(1e6 / rates["cyclone"])


def fig_c(bench: Bench, r: int) -> None:
    """``submit_once_many`` in batches, against cyclone's and raw's one-at-a-time rates."""
    n = bench.sizes.new_keys
    single = bench.figures.get("a1")
    for size in bench.sizes.batches:
        f = bench.fig(
            f"c{size}",
            f"submit_once_many, batch {size}",
            "submits/s",
            True,
            raw_label="raw one-at-a-time",
            goal=10.0 if size >= 1000 else None,
            goal_text=">= 10x cyclone one-at-a-time" if size >= 1000 else "",
        )
        if single is not None:
            f.raw = single.raw
            f.goal_base = single.cyclone
        items = [(f"c{size}-{r}-{i}", workloads.payload(i)) for i in range(n)]
        workloads.one_step.submit_once_many(
            bench.engine, [(f"c{size}-{r}-w{i}", workloads.payload(i)) for i in range(size)]
        )
        t0 = time.perf_counter()
        for start in range(0, n, size):
            out = workloads.one_step.submit_once_many(bench.engine, items[start : start + size])
            assert all(created for _run, created in out)
        f.cyclone.append(n / (time.perf_counter() - t0))
