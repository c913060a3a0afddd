"""Fan-out: ``@wf.map(over=node)`` runs once per item of the list ``over`` returned, each item
a job of its own (own attempts, claimed in parallel by every worker), and its output is the
list of the items' outputs in order."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from collections import Counter
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from werkzeug.test import Client

import cyclone
from cyclone._store import rescue as _rescue
from cyclone.dashboard import create_app
from cyclone.schema import jobs
from tests.conftest import StatementCounter, wait_until
from tests.support import docs, worker_proc
from tests.support.workers import Background, spawn_worker, stop_all
from tests.test_cli_parked import cli


class Line(msgspec.Struct):
    sku: str
    qty: int


def order_flow(name: str) -> cyclone.ResultWorkflow[int, list[str]]:
    """lines -> ship (a map over lines) -> summary (the result)."""
    wf: cyclone.ResultWorkflow[int, list[str]] = cyclone.ResultWorkflow(
        name, input=int, output=list[str]
    )

    @wf.step()
    def lines(ctx: cyclone.StepContext, n: int) -> list[Line]:
        return [Line(f"sku{i}", i) for i in range(n)]

    @wf.map(over=lines)
    def ship(ctx: cyclone.StepContext, line: Line) -> str:
        assert isinstance(line, Line)
        return f"{line.sku}x{line.qty}"

    @wf.result(after=[ship])
    def summary(ctx: cyclone.StepContext, n: int) -> list[str]:
        return ctx.output(ship)

    return wf


def items_of(engine: sa.Engine, run_id: Any) -> list[sa.Row[Any]]:
    """The run's map items (index, state, attempt, worker, errors), by index."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(
                    jobs.c.item, jobs.c.state, jobs.c.attempt, jobs.c.worker_id, jobs.c.errors
                )
                .where(jobs.c.run_id == run_id, jobs.c.item.is_not(None))
                .order_by(jobs.c.item)
            )
        )


def test_a_map_node_outputs_its_items_outputs_in_order_decoded_to_its_annotation(
    engine: sa.Engine, name: str
) -> None:
    wf = order_flow(name)
    run = wf.submit(engine, 25)
    cyclone.Worker(engine, workflows=[wf], concurrency=4).drain()
    assert run.result(timeout=10) == [f"sku{i}x{i}" for i in range(25)]
    items = items_of(engine, run.id)
    assert [row.item for row in items] == list(range(25))
    assert {row.state for row in items} == {"completed"}


def test_each_item_sees_the_map_nodes_after_upstreams_not_the_list_and_takes_its_options(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.ResultWorkflow[int, list[int]] = cyclone.ResultWorkflow(
        name, input=int, output=list[int]
    )

    @wf.step()
    def base(ctx: cyclone.StepContext, n: int) -> int:
        return 100

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers, after=[base], max_attempts=7, queue=f"{name}-q", priority=3)
    def add(ctx: cyclone.StepContext, i: int) -> int:
        with pytest.raises(KeyError, match="numbers"):  # the list is not read with each item
            ctx.output(numbers)
        return ctx.output(base) + i

    @wf.result(after=[add])
    def total(ctx: cyclone.StepContext, n: int) -> list[int]:
        return ctx.output(add)

    run = wf.submit(engine, 3)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.result(timeout=10) == [100, 101, 102]
    with engine.connect() as conn:
        options = set(
            conn.execute(
                sa.select(jobs.c.max_attempts, jobs.c.queue, jobs.c.priority).where(
                    jobs.c.run_id == run.id, jobs.c.item.is_not(None)
                )
            )
        )
    assert options == {(7, f"{name}-q", 3)}


def test_items_are_claimed_in_parallel_by_several_workers(engine: sa.Engine, name: str) -> None:
    both_running = threading.Barrier(2, timeout=20)
    wf: cyclone.ResultWorkflow[int, list[int]] = cyclone.ResultWorkflow(
        name, input=int, output=list[int]
    )

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers, max_attempts=1)
    def meet(ctx: cyclone.StepContext, i: int) -> int:
        if i < 2:
            both_running.wait()  # items 0 and 1 run at the same time, or this fails
        return i

    @wf.result(after=[meet])
    def done(ctx: cyclone.StepContext, n: int) -> list[int]:
        return ctx.output(meet)

    run = wf.submit(engine, 6)
    workers = [
        cyclone.Worker(engine, workflows=[wf], concurrency=1, poll_interval=0.1) for _ in range(2)
    ]
    serving = [Background(w.run) for w in workers]
    try:
        assert run.result(timeout=30) == list(range(6))
    finally:
        for w in workers:
            w.stop()
        for s in serving:
            s.join(10)
    ran = {row.worker_id for row in items_of(engine, run.id) if row.item < 2}
    assert ran == {w.id for w in workers}


def test_an_empty_list_completes_the_map_node_at_once(engine: sa.Engine, name: str) -> None:
    wf = order_flow(name)
    run = wf.submit(engine, 0)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.result(timeout=10) == []
    assert items_of(engine, run.id) == []


def test_an_output_that_is_not_a_list_fails_the_map_node_with_a_clear_error(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def config(ctx: cyclone.StepContext, n: int) -> dict[str, int]:
        return {"n": n}

    @wf.map(over=config)
    def each(ctx: cyclone.StepContext, item: Any) -> None:
        raise AssertionError("never called")

    run = wf.submit(engine, 1)
    cyclone.Worker(engine, workflows=[wf]).drain()
    status = run.wait(timeout=10)
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert status.error["type"] == "MapError"
    assert "'each' maps over the output of 'config', which is not a list" in status.error["message"]
    assert items_of(engine, run.id) == []


def failing_map(name: str, fail: set[int], runs: Counter[int]) -> cyclone.ResultWorkflow[int, Any]:
    """numbers -> double (a map whose items in ``fail`` raise), counting executions."""
    wf: cyclone.ResultWorkflow[int, list[int]] = cyclone.ResultWorkflow(
        name, input=int, output=list[int]
    )
    lock = threading.Lock()

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers, max_attempts=2)
    def double(ctx: cyclone.StepContext, i: int) -> int:
        with lock:
            runs[i] += 1
        if i in fail:
            raise ValueError(f"item {i} is broken")
        return 2 * i

    @wf.result(after=[double])
    def doubled(ctx: cyclone.StepContext, n: int) -> list[int]:
        return ctx.output(double)

    return wf


def test_a_failed_item_fails_the_node_and_the_run_naming_the_item(
    engine: sa.Engine, name: str
) -> None:
    runs: Counter[int] = Counter()
    wf = failing_map(name, {3}, runs)
    run = wf.submit(engine, 6)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=2, backoff=lambda n: 0.0)
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert (status.error["step"], status.error["item"]) == ("double", 3)
    assert "item 3 is broken" in status.error["message"]
    assert runs[3] == 2  # its own attempts
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    (node,) = [step for step in detail.steps if step.name == "double"]
    assert node.state == cyclone.JobState.FAILED  # the node, not only the run
    with pytest.raises(cyclone.RunFailedError):
        run.result(timeout=1)


def test_retry_re_runs_only_the_failed_items_and_keeps_the_completed_ones(
    engine: sa.Engine, name: str
) -> None:
    runs: Counter[int] = Counter()
    fail = {1, 4}
    wf = failing_map(name, fail, runs)
    run = wf.submit(engine, 6)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=1, backoff=lambda n: 0.0)
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    assert run.status().state == cyclone.RunState.FAILED
    kept = {row.item for row in items_of(engine, run.id) if row.state == "completed"}
    assert 0 < len(kept) < 6
    before = Counter(runs)
    fail.clear()
    run.retry()
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    assert run.result(timeout=5) == [0, 2, 4, 6, 8, 10]
    again = runs - before
    assert set(again) == set(range(6)) - kept  # the completed items kept their outputs
    assert set(again.values()) == {1}


def failed_by_item_one(engine: sa.Engine, name: str) -> tuple[Any, cyclone.Worker, set[int]]:
    """A run of :func:`failing_map` over 3 items failed by item 1, the worker that ran it,
    and the set of items that fail (clear it to let item 1 pass)."""
    fail = {1}
    wf = failing_map(name, fail, Counter())
    run = wf.submit(engine, 3)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=1, backoff=lambda n: 0.0)
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    return run, worker, fail


def map_node_of(run: Any) -> Any:
    """The condition naming the map node ``double`` of ``run``'s jobs (not its items)."""
    return (jobs.c.run_id == run.id) & (jobs.c.kind == "double") & jobs.c.item.is_(None)


CLAIMED_ELSEWHERE = {
    "state": "running",
    "worker_id": "elsewhere",
    "attempt": jobs.c.attempt + 1,
    "lease": jobs.c.lease + 1,
    "heartbeat_at": sa.func.now(),
}
"""The columns of a job claimed by another worker, which has not decided about it yet."""


@pytest.mark.parametrize("node", ["available", "running elsewhere"])
def test_an_item_failing_for_good_after_a_retry_fails_its_map_node_not_yet_parked_again(
    engine: sa.Engine, name: str, node: str
) -> None:
    # After a retry the map node waits to be claimed again beside its failed items, or a
    # worker is deciding about it. An item failing for good meanwhile fails the node, as
    # the run names it; it was cancelled as a step not started, or by that worker.
    run, worker, fail = failed_by_item_one(engine, name)
    run.retry()
    the_node = map_node_of(run)
    hold = (
        # Not claimed before its item: due in an hour.
        {"scheduled_at": sa.func.now() + sa.text("interval '1 hour'")}
        if node == "available"
        else CLAIMED_ELSEWHERE
    )
    with engine.begin() as conn:
        (lease,) = conn.execute(
            sa.update(jobs).where(the_node).values(**hold).returning(jobs.c.lease)
        ).one()
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert (status.error["step"], status.error["item"]) == ("double", 1)
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(jobs.c.state, jobs.c.attempt, jobs.c.lease, jobs.c.worker_id).where(the_node)
        ).one()
    # The deciding worker's lease no longer matches: its park or end changes nothing.
    assert tuple(row) == ("failed", 0, lease + 1, None)
    fail.clear()
    run.retry()
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    assert run.result(timeout=5) == [0, 2, 4]


def test_a_map_node_handed_back_while_its_items_complete_waits_for_no_upstream(
    engine: sa.Engine, name: str
) -> None:
    # Found by a review: items completing while a worker decides about their map node
    # count it down, for the decision to count anew; handed back instead of decided,
    # the node kept a count below zero.
    run, worker, fail = failed_by_item_one(engine, name)
    fail.clear()
    run.retry()
    the_node = map_node_of(run)
    with engine.begin() as conn:
        node_id, lease = conn.execute(
            sa.update(jobs)
            .where(the_node)
            .values(**CLAIMED_ELSEWHERE)
            .returning(jobs.c.id, jobs.c.lease)
        ).one()
    worker.drain()  # the failed item runs again and completes: the node is counted down
    with engine.begin() as conn:  # the other worker stops and hands the node back
        assert _rescue.hand_back(conn, [(node_id, lease)]) == {node_id}
    with engine.connect() as conn:
        row = conn.execute(sa.select(jobs.c.state, jobs.c.pending_deps).where(the_node)).one()
    assert tuple(row) == ("available", 0)
    worker.drain()
    assert run.result(timeout=5) == [0, 2, 4]


def test_retry_all_expands_the_map_node_anew(engine: sa.Engine, name: str) -> None:
    runs: Counter[int] = Counter()
    wf = failing_map(name, set(), runs)
    run = wf.submit(engine, 3)
    worker = cyclone.Worker(engine, workflows=[wf])
    worker.drain()
    assert run.result(timeout=5) == [0, 2, 4]
    run.retry_all()
    worker.drain()
    assert run.result(timeout=5) == [0, 2, 4]
    assert runs == Counter({0: 2, 1: 2, 2: 2})
    assert [row.item for row in items_of(engine, run.id)] == [0, 1, 2]


def test_cancel_cancels_the_outstanding_items(engine: sa.Engine, name: str) -> None:
    release = threading.Event()
    started = threading.Event()
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers)
    def slow(ctx: cyclone.StepContext, i: int) -> int:
        started.set()
        release.wait(20)
        return i

    run = wf.submit(engine, 20)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=2, poll_interval=0.1)
    serving = Background(worker.run)
    try:
        assert started.wait(20)
        run.cancel()
        release.set()
        wait_until(lambda: all(r.state != "running" for r in items_of(engine, run.id)), timeout=20)
    finally:
        release.set()
        worker.stop()
        serving.join(10)
    assert run.status().state == cyclone.RunState.CANCELLED
    states = Counter(row.state for row in items_of(engine, run.id))
    assert set(states) <= {"cancelled", "completed"}
    assert states["cancelled"] >= 20 - 2


def test_a_map_over_ten_thousand_items_completes_with_its_items_made_in_one_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(name, input=int, output=int)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers)
    def same(ctx: cyclone.StepContext, i: int) -> int:
        return i

    @wf.result(after=[same])
    def count(ctx: cyclone.StepContext, n: int) -> int:
        out = ctx.output(same)
        assert out == list(range(n))
        return len(out)

    run = wf.submit(engine, 10_000)
    workers = [cyclone.Worker(engine, workflows=[wf], concurrency=8) for _ in range(2)]
    draining = [Background(w.drain) for w in workers]
    for d in draining:
        d.join(300)
    wait_until(lambda: workers[0].drain() >= 0 and run.status().done, timeout=60)
    assert run.result(timeout=5) == 10_000
    expansions = [s for s in statements.statements if "map_items AS" in s]
    assert len(expansions) == 1
    collections = [s for s in statements.statements if "jsonb_agg" in s and "ORDER BY" in s]
    assert len(collections) == 1


@pytest.mark.processes
def test_a_worker_killed_while_map_items_run_loses_no_item_and_no_output(
    engine: sa.Engine, name: str
) -> None:
    n = 200
    worker_proc.create_map_results_table(engine, name)
    wf = worker_proc.mapped(name)
    run = wf.submit(engine, worker_proc.Item(n=n))
    procs = [spawn_worker("map", name, "-") for _ in range(2)]
    table = worker_proc.map_results_table(name)

    def executed() -> int:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f'SELECT count(*) FROM "{table}"')).scalar_one())

    def holding(pid: int) -> bool:
        """Whether worker process ``pid`` holds running items."""
        with engine.connect() as conn:
            owners = conn.execute(
                sa.text(
                    "SELECT worker_id FROM cyclone_jobs WHERE run_id = :r "
                    "AND item IS NOT NULL AND state = 'running'"
                ),
                {"r": run.id},
            ).scalars()
            return any(int(owner.split(":")[1]) == pid for owner in owners)

    try:
        wait_until(lambda: executed() >= n // 4 and holding(procs[0].pid), timeout=60)
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].communicate(timeout=10)
        assert run.result(timeout=90) == [i * i for i in range(n)]
    finally:
        stop_all(procs)
    with engine.connect() as conn:
        ran = Counter(item for (item,) in conn.execute(sa.text(f'SELECT item FROM "{table}"')))
    assert set(ran) == set(range(n))  # no item lost
    items = items_of(engine, run.id)
    assert [row.item for row in items] == list(range(n))  # none made twice
    assert {row.state for row in items} == {"completed"}
    lost = [row.item for row in items if [e["type"] for e in row.errors] == ["WorkerLost"]]
    assert lost  # the killed worker had items running; they were rescued and run again
    assert all(ran[i] >= 1 for i in lost)
    # The invariants, checked after the test, hold the node's output to its items' outputs.


def half_done(engine: sa.Engine, name: str) -> cyclone.ResultRun[list[int]]:
    """A run whose map node ``double`` has 2 of its 4 items completed and 1 failed."""
    runs: Counter[int] = Counter()
    wf = failing_map(name, {2}, runs)
    run = wf.submit(engine, 4)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=1, backoff=lambda n: 0.0)
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    return run


def test_runs_show_lists_the_map_node_once_with_its_items_done_of_total(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    run = half_done(engine, name)
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    assert [s.name for s in detail.steps] == ["numbers", "double", "doubled"]
    double = detail.steps[1]
    assert double.items_total == 4
    assert double.items_done is not None
    assert double.items_done < 4
    assert detail.steps[0].items_total is None

    shown = cli(database_url, "runs", "show", str(run.id))
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.startswith("double "))
    assert f"({double.items_done}/4 items)" in row
    assert re.search(r"^error +step double item 2: ", shown.stdout, re.M), shown.stdout
    record = json.loads(cli(database_url, "runs", "show", str(run.id), "--json").stdout)
    step = next(s for s in record["steps"] if s["name"] == "double")
    assert (step["items_done"], step["items_total"]) == (double.items_done, 4)


def test_the_dashboard_run_page_shows_the_map_nodes_items_done_of_total(
    engine: sa.Engine, name: str
) -> None:
    run = half_done(engine, name)
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    done = detail.steps[1].items_done
    page = Client(create_app(engine)).get(f"/runs/{run.id}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f"{done}/4 items" in html
    assert f'<dd class="items">{done} of 4 done</dd>' in html


def test_the_map_page_blocks_run_in_order(
    database_url: URL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CYCLONE_DATABASE_URL", database_url.render_as_string(False))
    namespace: dict[str, Any] = {"__name__": "docs_map"}
    blocks = docs.all_blocks("docs/map.md")
    assert len(blocks) == docs.fenced_blocks("docs/map.md")
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, f"docs/map.md block {i + 1}", "exec"), namespace)
    finally:
        engine = namespace.get("engine")
        if isinstance(engine, sa.Engine):
            engine.dispose()


def test_a_map_can_map_over_another_maps_output(engine: sa.Engine, name: str) -> None:
    wf: cyclone.ResultWorkflow[int, list[str]] = cyclone.ResultWorkflow(
        name, input=int, output=list[str]
    )

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers)
    def squared(ctx: cyclone.StepContext, i: int) -> int:
        return i * i

    @wf.map(over=squared)
    def shown(ctx: cyclone.StepContext, sq: int) -> str:
        return f"<{sq}>"

    @wf.result(after=[shown])
    def out(ctx: cyclone.StepContext, n: int) -> list[str]:
        return ctx.output(shown)

    run = wf.submit(engine, 5)
    cyclone.Worker(engine, workflows=[wf], concurrency=4).drain()
    assert run.result(timeout=10) == ["<0>", "<1>", "<4>", "<9>", "<16>"]


def test_an_item_that_does_not_decode_to_the_annotation_fails_the_run_at_once(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def mixed(ctx: cyclone.StepContext, n: int) -> list[Any]:
        return [1, 2, "three", 4]

    @wf.map(over=mixed, max_attempts=5)
    def plus_one(ctx: cyclone.StepContext, i: int) -> int:
        return i + 1

    run = wf.submit(engine, 0)
    cyclone.Worker(engine, workflows=[wf], concurrency=1).drain()
    status = run.wait(timeout=10)
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert (status.error["step"], status.error["item"]) == ("plus_one", 2)
    assert status.error["type"] == "InputNotDecodable"
    three = next(row for row in items_of(engine, run.id) if row.item == 2)
    assert three.attempt == 1  # not retried: the item will not change


def test_items_completing_while_their_retried_map_nodes_are_decided_are_all_counted(
    engine: sa.Engine, name: str
) -> None:
    """Many retried runs at once: each map node is claimed again beside its failed items,
    so items complete while their node decides how many it still waits for."""
    broken = threading.Event()
    broken.set()
    wf: cyclone.ResultWorkflow[int, list[int]] = cyclone.ResultWorkflow(
        name, input=int, output=list[int]
    )

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers, max_attempts=1)
    def flaky(ctx: cyclone.StepContext, i: int) -> int:
        if i % 3 == 0 and broken.is_set():
            raise ValueError("broken for now")
        return i

    @wf.result(after=[flaky])
    def out(ctx: cyclone.StepContext, n: int) -> list[int]:
        return ctx.output(flaky)

    handles = [wf.submit(engine, 12) for _ in range(20)]
    workers = [cyclone.Worker(engine, workflows=[wf], concurrency=8) for _ in range(2)]
    for run in handles:
        wait_until(lambda run=run: workers[0].drain() >= 0 and run.status().done, timeout=30)
    assert {run.status().state for run in handles} == {cyclone.RunState.FAILED}
    broken.clear()
    assert cyclone.Client(engine).retry_runs(workflow=name) == 20
    draining = [Background(w.drain) for w in workers]
    for d in draining:
        d.join(60)
    for run in handles:
        wait_until(lambda run=run: workers[1].drain() >= 0 and run.status().done, timeout=30)
        assert run.result(timeout=5) == list(range(12))


def test_a_map_node_can_be_the_result_node_and_the_run_result_is_its_list(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.ResultWorkflow[int, list[int]] = cyclone.ResultWorkflow(
        name, input=int, output=list[int]
    )

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers, result=True)
    def cubes(ctx: cyclone.StepContext, i: int) -> int:
        return i**3

    run = wf.submit(engine, 4)
    cyclone.Worker(engine, workflows=[wf], concurrency=2).drain()
    assert run.result(timeout=10) == [0, 1, 8, 27]
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    assert detail.result == [0, 1, 8, 27]

    plain: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-plain", input=int)
    plain.step()(numbers.fn)
    with pytest.raises(cyclone.DefinitionError, match="needs a ResultWorkflow"):
        plain.map(over="numbers", result=True)(cubes.fn)
