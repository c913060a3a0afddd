"""Many keys under one limit: a claim (and an admission) takes the least recently served
keys first, reading the front of that order and the keys with waiting work, not every key
that ever had some (a limit keyed by customer keeps a row per customer)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits
from cyclone.schema import jobs


def keyed_kind(name: str) -> cyclone.StandaloneStep[Any, Any]:
    return cyclone.step(name, concurrency=cyclone.Concurrency(1, key=lambda args: args["k"]))(
        lambda ctx, args: None
    )


def keyed_workflow(name: str) -> cyclone.Workflow[Any]:
    """A one-step workflow under ``Concurrency(1)`` per its input's ``k``: its limit
    holds runs back, and admits them key by key."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        name, input=dict, concurrency=cyclone.Concurrency(1, key=lambda inp: inp["k"])
    )
    wf.step("only")(lambda ctx, value: None)
    return wf


def keys_done_with(engine: sa.Engine, limit: str, n: int) -> None:
    """``n`` key rows of ``limit`` with no job, served before every other key; the keys'
    statistics taken then, as autovacuum takes them after such a growth (without any,
    the planner may read the front's bound off every key's index entry, sorting them)."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_limit_keys (name, key, served_at) SELECT :limit, "
                "'done-' || g, now() - interval '1 day' + g * interval '1 ms' "
                "FROM generate_series(1, :n) g"
            ),
            {"limit": limit, "n": n},
        )
        conn.execute(sa.text("ANALYZE cyclone_limit_keys"))


def served_in_order(engine: sa.Engine, limit: str, keys: list[str]) -> None:
    """Mark ``keys`` served an hour ago, one second apart, the first least recently."""
    with engine.begin() as conn:
        for i, key in enumerate(keys):
            conn.execute(
                sa.text(
                    "UPDATE cyclone_limit_keys SET served_at = now() - interval '1 hour' "
                    "+ :i * interval '1 second' WHERE name = :limit AND key = :key"
                ),
                {"i": i, "limit": limit, "key": key},
            )


def claimed_keys(engine: sa.Engine, kind: str, limit: str, n: int) -> list[str]:
    with _executor.connect(engine) as conn:
        claimed = _limits.claim_gated(
            conn,
            worker_id="test",
            names=(limit,),
            queues=None,
            served=_limits.Served((kind,), ()),
            limit=n,
        )
    assert all(job.slot is not None for job in claimed)
    return sorted((job.slot[1] for job in claimed if job.slot), key=ORDER.index)


ORDER = [f"live-{i}" for i in (7, 2, 9, 0, 4, 1, 8, 3, 6, 5)]
"""The live keys, least recently served first."""


def waiting_behind(engine: sa.Engine, name: str, done_with: int) -> str:
    """A job of the kind ``name`` for each key of :data:`ORDER`, the keys served in that
    order, behind ``done_with`` keys done with; the limit's name."""
    step = keyed_kind(name)
    limit = f"kind:{name}"
    with engine.begin() as conn:
        for key in ORDER:
            step.enqueue_tx(conn, {"k": key})
    served_in_order(engine, limit, ORDER)
    keys_done_with(engine, limit, done_with)
    return limit


@pytest.mark.parametrize("done_with", [0, 10, 40, 2000])
def test_a_claim_takes_the_least_recently_served_keys_first_however_many_are_done_with(
    own_engine: sa.Engine, name: str, done_with: int
) -> None:
    """Below the front (no key done with), across it (some) and past it (all of the front
    done with), the claim takes exactly the keys least recently served that wait."""
    limit = waiting_behind(own_engine, name, done_with)
    assert claimed_keys(own_engine, name, limit, 3) == ORDER[:3]
    assert claimed_keys(own_engine, name, limit, 4) == ORDER[3:7]
    assert claimed_keys(own_engine, name, limit, 10) == ORDER[7:]
    with own_engine.begin() as conn:  # claimed by no worker: nothing is to run them
        conn.execute(jobs.delete().where(jobs.c.kind == name))


def rows_read(plan: str, table: str) -> int:
    """The rows the nodes of ``plan`` (EXPLAIN ANALYZE) reading ``table`` read in all:
    those they returned and those their filter removed, over every loop."""
    read, current = 0, False
    for line in plan.splitlines():
        node = re.search(r"on (\w+)\b.*actual rows=(\d+) loops=(\d+)", line)
        if node:
            current = node.group(1) == table
            loops = int(node.group(3))
            if current:
                read += int(node.group(2)) * loops
        elif "->" in line:
            current = False
        removed = re.search(r"Rows Removed by (?:Filter|Index Recheck): (\d+)", line)
        if removed and current:
            read += int(removed.group(1)) * loops
    return read


def explained(engine: sa.Engine, compiled: _executor.Compiled, params: dict[str, Any]) -> str:
    """The plan of ``compiled`` run (EXPLAIN ANALYZE) in a transaction rolled back."""
    with engine.connect() as conn:
        plan = "\n".join(
            conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + compiled.sql,
                {**compiled.defaults, **params},
            ).scalars()
        )
        conn.rollback()
    return plan


def test_a_claim_reads_no_key_done_with_past_the_front_of_its_order(
    own_engine: sa.Engine, name: str
) -> None:
    """With 3,000 keys done with, served before the few that wait, the claim reads the
    front of the keys' order and the keys with waiting jobs: before, it read (and probed
    for a due job) every key of the limit, 20,000 of them 30 s a claim."""
    limit = waiting_behind(own_engine, name, 3000)
    compiled = _limits._fast_claim_gated(
        (limit,), None, _limits.Served((name,), ()), 8, False, False, False
    )
    plan = explained(own_engine, compiled, {"me": "test"})
    assert len(re.findall(r"Update on cyclone_jobs\b.*actual rows=8 ", plan)) == 1, plan
    assert rows_read(plan, "cyclone_limit_keys") < 200, plan


def test_an_admission_reads_no_key_done_with_past_the_front_of_its_order(
    own_engine: sa.Engine, name: str
) -> None:
    """The admission of runs held by a workflow's limit locks its keys in turn as the
    claim does: 3,000 keys done with are not read."""
    wf = keyed_workflow(name)
    wf.submit_once_many(own_engine, [(f"{key}-{i}", {"k": key}) for key in ORDER for i in (0, 1)])
    limit = f"workflow:{name}"
    keys_done_with(own_engine, limit, 3000)
    compiled = _executor.Compiled(_limits.lock_held_keys_stmt((limit,), 32))
    plan = explained(own_engine, compiled, {})
    locked = re.search(r"LockRows.*actual rows=(\d+) ", plan)
    assert rows_read(plan, "cyclone_limit_keys") < 200, plan
    assert locked is not None, plan


def test_a_claim_of_a_limit_with_no_more_keys_than_its_front_walks_no_waiting_key(
    own_engine: sa.Engine, name: str
) -> None:
    """The walk of the keys with waiting jobs is for a front that holds too few keys to
    take: with every key in the front it is never run. Run at each claim (and its count
    of contended keys), it slowed every claim of a few busy keys, and a key with few jobs
    waited behind one with many under load."""
    limit = waiting_behind(own_engine, name, 0)  # 10 keys: fewer than a claim of 16 takes
    compiled = _limits._fast_claim_gated(
        (limit,), None, _limits.Served((name,), ()), 16, False, False, False
    )
    plan = explained(own_engine, compiled, {"me": "test"})
    walks = re.findall(r"Recursive Union.*", plan)
    assert walks, plan
    assert all("never executed" in walk for walk in walks), plan


def test_a_claim_probes_each_key_by_its_index_where_statistics_say_few_keys_hold_many_jobs(
    own_engine: sa.Engine, name: str
) -> None:
    """With statistics taken while 20 keys held 50 jobs each, the planner expected a scan
    of the jobs to find a key's first job within a few rows, and read the whole table for
    each key done with at the front: ``limit_key``'s ``n_distinct`` of 10,000 (revision
    cyclone_0029_limit_key_distinct) keeps each probe on ``ix_cyclone_jobs_gated``."""
    step = keyed_kind(name)
    limit = f"kind:{name}"
    with own_engine.begin() as conn:
        for i in range(1000):
            step.enqueue_tx(conn, {"k": f"live-{i % 20}"})
        conn.execute(sa.text("ANALYZE cyclone_jobs"))
    served_in_order(own_engine, limit, [f"live-{i}" for i in range(20)])
    keys_done_with(own_engine, limit, 2000)
    compiled = _limits._fast_claim_gated(
        (limit,), None, _limits.Served((name,), ()), 8, False, False, False
    )
    plan = explained(own_engine, compiled, {"me": "test"})
    assert len(re.findall(r"Update on cyclone_jobs\b.*actual rows=8 ", plan)) == 1, plan
    assert "Seq Scan on cyclone_jobs" not in plan, plan
    assert rows_read(plan, "cyclone_jobs") < 200, plan


def test_an_admission_probes_each_key_by_its_index_where_statistics_say_few_keys_hold_many_runs(
    own_engine: sa.Engine, name: str
) -> None:
    """The admission's probe of held runs, under the same statistics over the runs."""
    wf = keyed_workflow(name)
    wf.submit_once_many(own_engine, [(f"r{i}", {"k": f"live-{i % 20}"}) for i in range(1000)])
    with own_engine.begin() as conn:
        conn.execute(sa.text("ANALYZE cyclone_runs"))
    limit = f"workflow:{name}"
    keys_done_with(own_engine, limit, 2000)
    compiled = _executor.Compiled(_limits.lock_held_keys_stmt((limit,), 32))
    plan = explained(own_engine, compiled, {})
    assert re.search(r"LockRows.*actual rows=[1-9]", plan), plan
    assert "Seq Scan on cyclone_runs" not in plan, plan
    assert rows_read(plan, "cyclone_runs") < 200, plan


def test_an_admission_walks_full_keys_with_held_runs_once(own_engine: sa.Engine, name: str) -> None:
    """With every key full and a run held behind it (a busy limit's usual state), the
    admission reads each key once: a step of the walk of the keys with held runs, a probe
    for a held run due and a count of the runs in progress. Its count of the keys it
    skipped read them all a second time, unlocked (5 reads of the runs per key, not 3):
    16 ms a statement became 25 with 2,000 keys, run after every claim round."""
    n = 300
    wf = keyed_workflow(name)
    limit = f"workflow:{name}"
    wf.submit_once_many(own_engine, [(f"a{i}", {"k": f"k{i}"}) for i in range(n)])
    assert _limits.admit_runs(own_engine, (limit,), batch=n) == n
    wf.submit_once_many(own_engine, [(f"b{i}", {"k": f"k{i}"}) for i in range(n)])  # held
    with own_engine.begin() as conn:
        conn.execute(sa.text("ANALYZE cyclone_runs"))
        conn.execute(sa.text("ANALYZE cyclone_limit_keys"))
    compiled = _executor.Compiled(_limits.lock_held_keys_stmt((limit,), 32))
    plan = explained(own_engine, compiled, {})
    assert rows_read(plan, "cyclone_runs") < 4 * n, plan
    assert rows_read(plan, "cyclone_limit_keys") < n + 200, plan
    assert _limits.admit_runs(own_engine, (limit,)) == 0
    assert cyclone.Client(own_engine).cancel_runs(workflow=name) == 2 * n
