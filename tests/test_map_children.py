"""Maps and children together: a map over a child node's output, a map of children (one
child run per item: ``@wf.child(workflow, over=node)``), and forks of runs with map and
child nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa
from werkzeug.test import Client as WebClient

import cyclone
from cyclone._store import children as _children
from cyclone.dashboard import create_app
from cyclone.schema import jobs
from tests.conftest import wait_until
from tests.support import invariants, processes
from tests.support.child_defs import fleet
from tests.support.dashboard import text_of
from tests.support.workers import REPO, Background, blocked_by, rescue_lost_jobs
from tests.test_children import StepThreadStatements, session_waits_to_insert_the_child


def drain(engine: sa.Engine, *workflows: Any) -> None:
    with cyclone.Worker(engine, workflows=list(workflows), sweep=False) as worker:
        worker.drain()


def items_of(engine: sa.Engine, run_id: Any) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(jobs.c.kind, jobs.c.item, jobs.c.state, jobs.c.output)
                .where(jobs.c.run_id == run_id, jobs.c.item.is_not(None))
                .order_by(jobs.c.kind, jobs.c.item)
            )
        )


def output_of(engine: sa.Engine, run_id: Any, kind: str) -> Any:
    """The output of the node ``kind`` of the run (not of its items)."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(jobs.c.output).where(
                jobs.c.run_id == run_id, jobs.c.kind == kind, jobs.c.item.is_(None)
            )
        ).scalar_one()


def children_of(engine: sa.Engine, run_id: Any) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT id, submit_key, state, parent_node FROM cyclone_runs "
                    "WHERE parent_id = :r ORDER BY submit_key"
                ),
                {"r": run_id},
            )
        )


def skus(name: str) -> cyclone.ResultWorkflow[int, list[str]]:
    """A child workflow whose result is a list: ``n`` skus."""
    wf: cyclone.ResultWorkflow[int, list[str]] = cyclone.ResultWorkflow(
        f"{name}-skus", input=int, output=list[str]
    )

    @wf.result()
    def listing(ctx: cyclone.StepContext, n: int) -> list[str]:
        return [f"sku{i}" for i in range(n)]

    return wf


def test_a_map_over_a_child_nodes_output_runs_once_per_item_of_the_childs_result(
    engine: sa.Engine, name: str
) -> None:
    child = skus(name)
    wf: cyclone.ResultWorkflow[int, list[str]] = cyclone.ResultWorkflow(
        name, input=int, output=list[str]
    )

    @wf.child(child)
    def catalogue(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @wf.map(over=catalogue, result=True)
    def pick(ctx: cyclone.StepContext, sku: str) -> str:
        return sku.upper()

    run = wf.submit(engine, 5)
    with cyclone.Worker(engine, workflows=[wf, child], concurrency=4, sweep=False) as worker:
        worker.drain()
    assert run.result(timeout=10) == [f"SKU{i}" for i in range(5)]
    assert [r.output for r in items_of(engine, run.id)] == [f"SKU{i}" for i in range(5)]
    (kid,) = run.children()
    assert kid.status().state == cyclone.RunState.COMPLETED


def mapped_flow(name: str, calls: Counter[str], *, broken: set[int]) -> cyclone.Workflow[int]:
    """numbers -> double (a map) -> total; an item in ``broken`` raises."""
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step(max_attempts=1)
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        calls["numbers"] += 1
        return list(range(n))

    @wf.map(over=numbers, max_attempts=1)
    def double(ctx: cyclone.StepContext, i: int) -> int:
        calls[f"double{i}"] += 1
        if i in broken:
            raise RuntimeError(f"item {i} is broken")
        return 2 * i

    @wf.step(after=[double], max_attempts=1)
    def total(ctx: cyclone.StepContext, n: int) -> int:
        calls["total"] += 1
        return sum(ctx.output(double))

    return wf


def test_a_fork_keeping_a_completed_map_node_copies_its_items_and_does_not_rerun_them(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    wf = mapped_flow(name, calls, broken=set())
    run = wf.submit(engine, 4)
    drain(engine, wf)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    fork, created = wf.run(engine, run.id).fork(f"{name}-fork", rerun=["total"])
    assert created
    drain(engine, wf)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert (calls["numbers"], calls["double0"], calls["total"]) == (1, 1, 2)
    assert [(r.kind, r.item, r.state, r.output) for r in items_of(engine, fork.id)] == [
        ("double", i, "completed", 2 * i) for i in range(4)
    ]
    assert output_of(engine, fork.id, "double") == [0, 2, 4, 6]
    assert output_of(engine, fork.id, "total") == 12


def test_a_fork_rerunning_a_map_node_expands_it_anew_on_the_new_code(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    buggy = mapped_flow(name, calls, broken={1})  # the items after it completed
    run = buggy.submit(engine, 3)
    drain(engine, buggy)
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    fixed = mapped_flow(name, calls, broken=set())
    fork, _ = fixed.run(engine, run.id).fork(f"{name}-fork")  # double failed: it re-runs
    drain(engine, fixed)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert calls["numbers"] == 1  # kept
    assert (calls["double0"], calls["double1"]) == (2, 2)  # every item of the new expansion
    assert output_of(engine, fork.id, "total") == 6
    assert len(items_of(engine, fork.id)) == 3


def child_flow(
    name: str, child: cyclone.ResultWorkflow[int, list[str]], calls: Counter[str], *, fail: bool
) -> cyclone.Workflow[int]:
    """catalogue (a child node) -> check, which raises when ``fail``."""
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.child(child)
    def catalogue(ctx: cyclone.StepContext, n: int) -> int:
        calls["catalogue"] += 1
        return n

    @wf.step(after=[catalogue], max_attempts=1)
    def check(ctx: cyclone.StepContext, n: int) -> int:
        calls["check"] += 1
        if fail:
            raise RuntimeError("check is broken")
        return len(ctx.output(catalogue))

    return wf


def test_a_fork_keeping_a_completed_child_node_keeps_its_output_and_makes_no_child(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    child = skus(name)
    buggy = child_flow(name, child, calls, fail=True)
    run = buggy.submit(engine, 3)
    drain(engine, buggy, child)
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    fixed = child_flow(name, child, calls, fail=False)
    fork, _ = fixed.run(engine, run.id).fork(f"{name}-fork")
    drain(engine, fixed, child)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert fork.children() == []
    assert calls["catalogue"] == 1
    assert output_of(engine, fork.id, "catalogue") == ["sku0", "sku1", "sku2"]
    assert output_of(engine, fork.id, "check") == 3


def test_a_fork_rerunning_a_child_node_makes_a_new_child_for_the_fork(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    child = skus(name)
    wf = child_flow(name, child, calls, fail=False)
    run = wf.submit(engine, 2)
    drain(engine, wf, child)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    fork, _ = wf.run(engine, run.id).fork(f"{name}-fork", rerun=["catalogue"])
    drain(engine, wf, child)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    (old,) = run.children()
    (new,) = fork.children()
    assert new.id != old.id
    assert new.status().parent_id == fork.id
    assert calls["catalogue"] == 2


def test_a_map_of_children_submits_one_child_per_item_and_outputs_their_results_in_order(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 4)
    with cyclone.Worker(engine, workflows=f.workflows, concurrency=3, sweep=False) as worker:
        worker.drain()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, run.id, "ship") == [1, 11, 21, 31]
    assert output_of(engine, run.id, "total") == [1, 11, 21, 31]
    kids = children_of(engine, run.id)
    assert sorted(k.submit_key for k in kids) == sorted(f"{run.id}/ship/{i}" for i in range(4))
    assert {k.state for k in kids} == {"completed"}
    listed = run.children()
    assert len(listed) == 4
    assert sorted(c.result() for c in listed) == [1, 11, 21, 31]
    assert sorted(f.outcome.submitted) == [0, 1, 2, 3]


def test_a_runs_children_are_listed_in_item_order_whatever_order_they_were_made_in(
    engine: sa.Engine, name: str
) -> None:
    # Items run in parallel, so their children are made in any order: listed by creation,
    # run.children() and the run's detail showed a map of children shuffled.
    f = fleet(name)
    run = f.dispatch.submit(engine, 4)
    drain(engine, *f.workflows)
    with engine.begin() as conn:  # made last item first
        conn.execute(
            sa.text(
                "UPDATE cyclone_runs SET created_at = created_at + (3 - parent_item) "
                "* interval '1 s' WHERE parent_id = :p"
            ),
            {"p": run.id},
        )
    assert [c.status().parent_item for c in run.children()] == [0, 1, 2, 3]
    assert [c.result() for c in run.children()] == [1, 11, 21, 31]
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    assert [c.parent_item for c in detail.children] == [0, 1, 2, 3]
    assert detail.children_total == 4


def test_retry_all_over_a_shorter_list_keeps_the_children_of_the_items_gone(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 4)
    drain(engine, *f.workflows)
    before = [c.id for c in run.children()]
    f.outcome.orders = 2
    run.retry_all()
    drain(engine, *f.workflows)
    assert run.status().state == "completed"
    # Items 0 and 1 read the children they had; the node's output has two results.
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    (total,) = [s for s in detail.steps if s.name == "total"]
    assert total.output == [1, 11]
    # The children of items 2 and 3 stay the run's children, listed after the others.
    assert [c.id for c in run.children()] == before
    assert [c.parent_item for c in detail.children] == [0, 1, 2, 3]
    assert detail.children_total == 4
    assert sorted(f.outcome.submitted) == [0, 1, 2, 3]  # each item found its child


def awaited_items(engine: sa.Engine, run_id: Any) -> dict[int, str]:
    """The items of the run whose children its node waits for (``parent_waits``), and
    each child's state."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT parent_item, state FROM cyclone_runs "
                "WHERE parent_id = :r AND parent_waits ORDER BY parent_item"
            ),
            {"r": run_id},
        )
        return {row.parent_item: row.state for row in rows}


def failed_while_items_0_and_2_run(engine: sa.Engine, name: str) -> tuple[Any, Any]:
    """A fleet run of 3 items whose item 1's child failed, failing the run, while the
    children of items 0 and 2 still run (held at their ``go``)."""
    f = fleet(name, hold=True)
    f.outcome.broken = {1}
    run = f.dispatch.submit(engine, 3)
    drain(engine, *f.workflows)
    f.parcel.run(engine, child_of_item(engine, run.id, 1)).signal("go", 1)
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    return f, run


def test_retry_all_of_a_map_of_children_leaves_a_running_child_to_its_items_new_expansion(
    engine: sa.Engine, name: str
) -> None:
    # Found by a review: item 1's child failed, and so the run, while the children of items
    # 0 and 2 still ran; retry_all forgot the items but left those children awaited, each
    # naming an item the run no longer had until the map expanded anew (or for good, over
    # a shorter list). Forgotten with their items, they are read anew, as a retried
    # parent's ended children are: each item of the new expansion waits for its child.
    f, run = failed_while_items_0_and_2_run(engine, name)
    assert awaited_items(engine, run.id) == {0: "running", 2: "running"}
    before = {k.submit_key: k.id for k in children_of(engine, run.id)}
    run.retry_all()
    invariants.check(engine)  # no child awaited by an item the run no longer has
    assert awaited_items(engine, run.id) == {}
    assert {k.submit_key: k.state for k in children_of(engine, run.id)} == {
        f"{run.id}/ship/0": "running",
        f"{run.id}/ship/1": "failed",
        f"{run.id}/ship/2": "running",
    }
    f.outcome.broken = set()
    drain(engine, *f.workflows)
    # The new items 0 and 2 wait for the children that still run; item 1 retried its own.
    assert awaited_items(engine, run.id) == {0: "running", 2: "running"}
    assert [(r.item, r.state) for r in item_rows(engine, run.id, "ship")] == [
        (0, "blocked"),
        (1, "completed"),
        (2, "blocked"),
    ]
    for i in (0, 2):
        f.parcel.run(engine, child_of_item(engine, run.id, i)).signal("go", 1)
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, run.id, "total") == [1, 11, 21]
    assert {k.submit_key: k.id for k in children_of(engine, run.id)} == before  # none anew
    assert sorted(f.outcome.submitted) == [0, 1, 2]  # no item's function ran again


def test_retry_all_over_a_shorter_list_leaves_the_running_child_of_an_item_gone_awaited_by_none(
    engine: sa.Engine, name: str
) -> None:
    f, run = failed_while_items_0_and_2_run(engine, name)
    gone = f.parcel.run(engine, child_of_item(engine, run.id, 2))
    f.outcome.broken, f.outcome.orders = set(), 2
    run.retry_all()
    drain(engine, *f.workflows)
    # Item 2 is gone: its child runs on, still the run's child, awaited by no item.
    assert awaited_items(engine, run.id) == {0: "running"}
    assert [r.item for r in item_rows(engine, run.id, "ship")] == [0, 1]
    assert gone.status().state == cyclone.RunState.RUNNING
    invariants.check(engine)
    for i in (0, 2):
        f.parcel.run(engine, child_of_item(engine, run.id, i)).signal("go", 1)
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, run.id, "total") == [1, 11]
    assert gone.status().state == cyclone.RunState.COMPLETED
    assert [c.status().parent_item for c in run.children()] == [0, 1, 2]


def test_retry_all_of_a_map_of_children_locks_their_children_in_order_before_its_jobs(
    own_engine: sa.Engine, name: str
) -> None:
    # A retry_all stops the items' children being awaited: it locks them after the run,
    # in the run lock order (as a worker recording steps of several of them does), and
    # before any job of the run (runs, then jobs: the lock order of cyclone.states).
    f = fleet(name, hold=True)
    f.outcome.broken = {1}
    run = f.dispatch.submit(own_engine, 3)
    drain(own_engine, *f.workflows)
    f.parcel.run(own_engine, child_of_item(own_engine, run.id, 1)).signal("go", 1)
    drain(own_engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    with own_engine.connect() as conn:
        first, last = conn.execute(
            sa.text(
                "SELECT id FROM cyclone_runs WHERE parent_id = :r AND state = 'running' "
                "ORDER BY created_at, id"
            ),
            {"r": run.id},
        ).scalars()
    with own_engine.connect() as holder:
        holder.execute(
            sa.text("SELECT 1 FROM cyclone_runs WHERE id = :c FOR NO KEY UPDATE"), {"c": first}
        )
        pid = holder.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        retrying = Background(run.retry_all, name="retry-all")
        wait_until(lambda: blocked_by(own_engine, pid) is not None, 30)
        with own_engine.begin() as probe:  # neither the later child nor a job is locked yet
            probe.execute(
                sa.text("SELECT 1 FROM cyclone_runs WHERE id = :c FOR NO KEY UPDATE NOWAIT"),
                {"c": last},
            )
            probe.execute(
                sa.text("SELECT 1 FROM cyclone_jobs WHERE run_id = :r FOR UPDATE NOWAIT"),
                {"r": run.id},
            )
        holder.rollback()
        retrying.join(30)
    assert run.status().state == cyclone.RunState.RUNNING
    assert awaited_items(own_engine, run.id) == {}
    invariants.check(own_engine)


def test_a_run_detail_lists_the_first_children_it_is_asked_for_and_counts_them_all(
    engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 4)
    drain(engine, *f.workflows)
    client = cyclone.Client(engine)
    some = client.get_run_detail(run.id, children_limit=2)
    assert some is not None
    assert ([c.parent_item for c in some.children], some.children_total) == ([0, 1], 4)
    none = client.get_run_detail(run.id, children_limit=0)
    assert none is not None
    assert (none.children, none.children_total) == ([], 4)
    with pytest.raises(ValueError, match="children_limit"):
        client.get_run_detail(run.id, children_limit=-1)
    # The dashboard's run page lists the first ones and says how many it leaves out.
    monkeypatch.setattr("cyclone.dashboard._app.CHILDREN_SHOWN", 3)
    page = text_of(WebClient(create_app(engine)).get(f"/runs/{run.id}").get_data(as_text=True))
    assert "from node ship item 2" in page
    assert "from node ship item 3" not in page
    assert "and 1 more child, not listed here" in page


def item_rows(engine: sa.Engine, run_id: Any, kind: str) -> list[sa.Row[Any]]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(jobs.c.item, jobs.c.state, jobs.c.worker_id, jobs.c.errors)
                .where(jobs.c.run_id == run_id, jobs.c.kind == kind, jobs.c.item.is_not(None))
                .order_by(jobs.c.item)
            )
        )


def child_of_item(engine: sa.Engine, run_id: Any, item: int) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT id FROM cyclone_runs WHERE parent_id = :r AND parent_item = :i"),
            {"r": run_id, "i": item},
        ).scalar_one()


def test_a_failed_child_fails_its_item_and_the_node_naming_the_child_run_and_the_item(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    f.outcome.broken = {2}
    run = f.dispatch.submit(engine, 4)
    drain(engine, *f.workflows)
    status = run.wait(timeout=10)
    assert status.state == cyclone.RunState.FAILED
    assert status.failed_step == "ship"
    assert status.error is not None
    assert status.error["item"] == 2
    broken = child_of_item(engine, run.id, 2)
    assert str(broken) in status.error["message"]
    assert "item 2" in status.error["message"]
    (error,) = item_rows(engine, run.id, "ship")[2].errors
    assert (error["type"], error["child_run_id"]) == ("ChildRunFailed", str(broken))


def test_retrying_a_map_of_children_reruns_only_the_failed_items_retrying_their_children(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    f.outcome.broken = {1, 3}
    run = f.dispatch.submit(engine, 4)
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    before = {k.submit_key: k.id for k in children_of(engine, run.id)}
    assert len(before) == 4
    submitted = sorted(f.outcome.submitted)
    f.outcome.broken = set()
    f.outcome.packed.clear()
    run.retry()
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, run.id, "total") == [1, 11, 21, 31]
    after = {k.submit_key: k.id for k in children_of(engine, run.id)}
    assert after == before  # the same children: the failed ones retried, none made anew
    assert sorted(f.outcome.packed) == [10, 30]  # only the failed children ran again
    assert sorted(f.outcome.submitted) == submitted  # no item's function ran again


def test_the_items_of_a_map_of_children_wait_holding_no_worker_and_wake_as_each_child_ends(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name, hold=True)
    run = f.dispatch.submit(engine, 3)
    drain(engine, *f.workflows)
    rows = item_rows(engine, run.id, "ship")
    assert [(r.state, r.worker_id) for r in rows] == [("blocked", None)] * 3
    for i in (2, 0, 1):
        f.parcel.run(engine, child_of_item(engine, run.id, i)).signal("go", 1)
        drain(engine, *f.workflows)
        assert item_rows(engine, run.id, "ship")[i].state == "completed"
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, run.id, "ship") == [1, 11, 21]


def test_cancelling_the_parent_of_a_map_of_children_cancels_every_child(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name, hold=True)
    run = f.dispatch.submit(engine, 3)
    drain(engine, *f.workflows)
    assert len(run.children()) == 3
    run.cancel()
    assert {c.status().state for c in run.children()} == {cyclone.RunState.CANCELLED}
    drain(engine, *f.workflows)
    assert run.status().state == cyclone.RunState.CANCELLED


def test_runs_show_and_the_dashboard_list_each_child_of_a_map_of_children_with_its_item(
    engine: sa.Engine, database_url: sa.URL, name: str
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 2)
    drain(engine, *f.workflows)
    first = child_of_item(engine, run.id, 0)
    second = child_of_item(engine, run.id, 1)
    assert cyclone.Client(engine).get_run(first).parent_item == 0  # type: ignore[union-attr]
    url = database_url.render_as_string(hide_password=False)
    shown = processes.run(
        [sys.executable, "-m", "cyclone", "--url", url, "runs", "show", str(run.id)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"{first} {f.parcel.name} completed (node ship item 0)" in shown.stdout
    assert f"{second} {f.parcel.name} completed (node ship item 1)" in shown.stdout
    as_json = processes.run(
        [sys.executable, "-m", "cyclone", "--url", url, "runs", "show", str(second), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    assert (record["parent_id"], record["parent_node"], record["parent_item"]) == (
        str(run.id),
        "ship",
        1,
    )
    web = WebClient(create_app(engine))
    page = text_of(web.get(f"/runs/{run.id}").get_data(as_text=True))
    assert "from node ship item 0" in page
    assert "from node ship item 1" in page
    child_page = text_of(web.get(f"/runs/{second}").get_data(as_text=True))
    assert "its child node ship item 1 submitted this run" in child_page


def test_runs_show_lists_the_children_it_is_told_to_and_counts_the_rest(
    engine: sa.Engine, database_url: sa.URL, name: str
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 4)
    drain(engine, *f.workflows)
    url = database_url.render_as_string(hide_password=False)

    def show(*args: str) -> subprocess.CompletedProcess[str]:
        return processes.run(
            [sys.executable, "-m", "cyclone", "--url", url, "runs", "show", str(run.id), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    some = show("--children", "2")
    assert some.returncode == 0, some.stderr
    assert "(node ship item 1)" in some.stdout
    assert "(node ship item 2)" not in some.stdout
    assert "and 2 more, not listed (--children N lists N)" in some.stdout
    every = show()
    assert every.returncode == 0, every.stderr
    assert "(node ship item 3)" in every.stdout
    assert "more, not listed" not in every.stdout
    one = json.loads(show("--json", "--children", "1").stdout)
    assert ([c["parent_item"] for c in one["children"]], one["children_total"]) == ([0], 4)
    whole = json.loads(show("--json").stdout)
    assert ([c["parent_item"] for c in whole["children"]], whole["children_total"]) == (
        [0, 1, 2, 3],
        4,
    )
    bad = show("--children", "-1")
    assert bad.returncode != 0
    assert bad.stderr.startswith("cyclone: Invalid value for '--children'"), bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_a_worker_killed_while_submitting_an_items_child_leaves_one_child_per_item(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 3)
    env = {**os.environ}
    assert "CYCLONE_TEST_DATABASE_URL" in env
    with engine.connect() as holder:
        # The test takes item 1's child key first (uncommitted): the worker's submit of
        # that child waits inside the transaction that would park the item, and dies there.
        holder.execute(
            sa.text(
                "INSERT INTO cyclone_runs (id, workflow, submit_key, input, definition, "
                "steps_remaining) VALUES (:id, :wf, :key, '0', gen_random_uuid(), 0)"
            ),
            {"id": uuid.uuid4(), "wf": f.parcel.name, "key": f"{run.id}/ship/1"},
        )
        proc = processes.popen(
            [sys.executable, "-m", "tests.support.child_proc", name],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_until(
                lambda: proc.poll() is not None or session_waits_to_insert_the_child(engine), 60
            )
            assert proc.poll() is None, proc.communicate()[1]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        finally:
            holder.rollback()
    assert proc.returncode == -signal.SIGKILL
    wait_until(lambda: not session_waits_to_insert_the_child(engine), 30)
    assert all(k.submit_key != f"{run.id}/ship/1" for k in children_of(engine, run.id))
    assert item_rows(engine, run.id, "ship")[1].state == "running"  # its owner is dead
    rescue_lost_jobs(engine)
    drain(engine, *f.workflows)
    assert run.wait(timeout=20).state == cyclone.RunState.COMPLETED
    kids = children_of(engine, run.id)
    assert sorted(k.submit_key for k in kids) == [f"{run.id}/ship/{i}" for i in range(3)]
    assert output_of(engine, run.id, "total") == [1, 11, 21]


def test_a_map_of_children_costs_a_maps_statements_and_a_child_nodes_per_item(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    # The first child of a version in a process also stores the version's definition (one
    # statement, once per process): counted from the second run.
    first = f.dispatch.submit(engine, 1)
    drain(engine, *f.workflows)
    assert first.wait(timeout=10).state == cyclone.RunState.COMPLETED
    run = f.dispatch.submit(engine, 3)
    with StepThreadStatements() as recorder:
        drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    sql = [q for q in recorder.sent if q.split()[0].upper() not in ("BEGIN", "COMMIT")]
    # The map node: expand (5), collect (4); each item as a child node: submit and park
    # (7), then woken, complete with its child's result (6).
    assert len(sql) == 5 + 4 + 3 * (7 + 6), "\n\n".join(sql)


def test_over_given_in_after_too_is_refused_when_defining_a_map_of_children(name: str) -> None:
    f = fleet(name)
    wf: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-other", input=int)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return [n]

    with pytest.raises(cyclone.DefinitionError, match="over= is an upstream already"):

        @wf.child(f.parcel, over=numbers, after=[numbers])
        def ship(ctx: cyclone.StepContext, i: int) -> int:
            return i


def test_retry_all_of_a_map_of_children_reads_each_items_completed_child_and_makes_none(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 3)
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    before = {k.submit_key: k.id for k in children_of(engine, run.id)}
    run.retry_all()
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert {k.submit_key: k.id for k in children_of(engine, run.id)} == before
    assert sorted(f.outcome.packed) == [0, 10, 20]  # each child ran once
    assert sorted(f.outcome.submitted) == [0, 1, 2]  # each item's function too
    assert output_of(engine, run.id, "total") == [1, 11, 21]


def test_a_fork_reads_a_failed_map_nodes_own_state_not_its_completed_items(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    buggy = mapped_flow(name, calls, broken={0})
    run = buggy.submit(engine, 3)
    drain(engine, buggy)
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    with engine.begin() as conn:  # a completed item's row now comes after its node's
        conn.execute(
            sa.text("UPDATE cyclone_jobs SET priority = priority WHERE run_id = :r AND item = 2"),
            {"r": run.id},
        )
    fixed = mapped_flow(name, calls, broken=set())
    fork, _ = fixed.run(engine, run.id).fork(f"{name}-fork")
    drain(engine, fixed)
    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, fork.id, "double") == [0, 2, 4]


def test_a_fork_keeps_a_map_of_children_without_children_or_reruns_it_with_new_ones(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    run = f.dispatch.submit(engine, 3)
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    kept, _ = f.dispatch.run(engine, run.id).fork(f"{name}-kept", rerun=["total"])
    again, _ = f.dispatch.run(engine, run.id).fork(f"{name}-again", rerun=["ship"])
    drain(engine, *f.workflows)
    assert kept.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert again.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert kept.children() == []
    assert [r.output for r in items_of(engine, kept.id)] == [1, 11, 21]
    assert sorted(k.submit_key for k in children_of(engine, again.id)) == [
        f"{again.id}/ship/{i}" for i in range(3)
    ]
    assert output_of(engine, kept.id, "total") == output_of(engine, again.id, "total")
    assert sorted(f.outcome.packed) == [0, 0, 10, 10, 20, 20]  # the source's and again's


def test_each_item_of_each_run_makes_exactly_one_child_under_concurrent_workers(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    submitted = [f.dispatch.submit(engine, n) for n in (5, 4, 6)]
    workers = [
        cyclone.Worker(engine, workflows=f.workflows, concurrency=3, sweep=False) for _ in range(3)
    ]
    serving = [Background(w.run) for w in workers]
    try:
        for run in submitted:
            assert run.wait(timeout=60).state == cyclone.RunState.COMPLETED
    finally:
        for w in workers:
            w.stop()
        for b in serving:
            b.join(30)
    for n, run in zip((5, 4, 6), submitted, strict=True):
        kids = children_of(engine, run.id)
        assert sorted(k.submit_key for k in kids) == sorted(f"{run.id}/ship/{i}" for i in range(n))
        assert output_of(engine, run.id, "total") == [10 * i + 1 for i in range(n)]
    assert len(f.outcome.packed) == 15  # each child ran once


def test_a_cancelled_child_fails_its_item_and_the_run_naming_the_child_run(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name, hold=True)
    run = f.dispatch.submit(engine, 2)
    drain(engine, *f.workflows)
    cancelled = child_of_item(engine, run.id, 1)
    f.parcel.run(engine, cancelled).cancel()
    drain(engine, *f.workflows)
    status = run.wait(timeout=10)
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert status.error["item"] == 1
    assert str(cancelled) in status.error["message"]
    assert "cancelled" in status.error["message"]
    other = child_of_item(engine, run.id, 0)
    assert f.parcel.run(engine, other).status().state == cyclone.RunState.RUNNING


def test_a_limited_map_of_children_runs_every_item_and_its_items_carry_the_limit(
    engine: sa.Engine, name: str
) -> None:
    f = fleet(name)
    wf: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-limited", input=int)

    @wf.step()
    def orders(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.child(f.parcel, over=orders, concurrency=cyclone.Concurrency(1, key=lambda n: "one"))
    def ship(ctx: cyclone.StepContext, order: int) -> int:
        return 10 * order

    run = wf.submit(engine, 3)
    with cyclone.Worker(engine, workflows=[wf, f.parcel], concurrency=3, sweep=False) as worker:
        worker.drain()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, run.id, "ship") == [1, 11, 21]
    with engine.connect() as conn:
        limited = conn.execute(
            sa.select(jobs.c.item, jobs.c.limit_name)
            .where(jobs.c.run_id == run.id, jobs.c.kind == "ship")
            .order_by(jobs.c.item.nulls_first())
        ).all()
    assert [row.limit_name is not None for row in limited] == [False, True, True, True]


# -- re-parking the items of a retried map of children, in batches ----------------------


def cancelled_and_retried(engine: sa.Engine, name: str, n: int) -> tuple[Any, cyclone.Run[int]]:
    """A map of ``n`` children, each made and waiting for its signal, the run cancelled
    (and every child with it), then retried: its items available again, each to retry
    its cancelled child."""
    f = fleet(name, hold=True)
    run = f.dispatch.submit(engine, n)
    drain(engine, *f.workflows)
    assert [r.state for r in item_rows(engine, run.id, "ship")] == ["blocked"] * n
    run.cancel()
    run.retry()
    assert [r.state for r in item_rows(engine, run.id, "ship")] == ["available"] * n
    return f, run


def reparked(engine: sa.Engine, run_id: Any) -> list[tuple[str, str, bool]]:
    """Each item's state with its child's state and whether the item waits for it."""
    with engine.connect() as conn:
        return [
            (row[0], row[1], row[2])
            for row in conn.execute(
                sa.text(
                    "SELECT j.state, c.state, c.parent_waits FROM cyclone_jobs j "
                    "JOIN cyclone_runs c ON c.parent_id = j.run_id AND c.parent_item = j.item "
                    "WHERE j.run_id = :r AND j.kind = 'ship' ORDER BY j.item"
                ),
                {"r": run_id},
            )
        ]


def lock_waiters(engine: sa.Engine) -> int:
    """Sessions of this database waiting for a row lock."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def test_retrying_a_map_of_children_reparks_its_items_in_batches_of_a_bounded_number_of_statements(
    engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_children, "REPARK_PER_BATCH", 10)
    f, run = cancelled_and_retried(engine, name, 25)
    worker = cyclone.Worker(engine, workflows=[f.dispatch], concurrency=1, sweep=False)
    with StepThreadStatements() as recorder, worker:
        worker.drain()
    assert reparked(engine, run.id) == [("blocked", "running", True)] * 25
    sql = [q for q in recorder.sent if q.split()[0].upper() not in ("BEGIN", "COMMIT")]
    # The map node parks again for its items (4 statements). Then three items are claimed
    # (0, 11, 22), each re-parking the next ten (the last, two): each retries its own
    # child and parks (15 statements, as any item's later attempt), then retries the
    # others' children and parks those items (8), whatever their number. One by one,
    # 4 + 25 * 15.
    assert len(sql) == 4 + 3 * (15 + 8), "\n\n".join(sql)
    for child in run.children():  # the same children, retried: each waits for its signal
        child.signal("go", 1)
    drain(engine, *f.workflows)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert output_of(engine, run.id, "total") == [10 * i + 1 for i in range(25)]
    assert sorted(f.outcome.submitted) == list(range(25))  # no item's function ran again


def test_two_workers_reparking_the_same_retried_map_retry_each_child_exactly_once(
    own_engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_children, "REPARK_PER_BATCH", 7)
    engine = own_engine
    f, run = cancelled_and_retried(engine, name, 60)
    with engine.begin() as conn:  # every restart of a run, as the database sees it
        conn.execute(sa.text("CREATE TABLE restarted (run_id uuid NOT NULL)"))
        conn.execute(
            sa.text(
                "CREATE FUNCTION note_restart() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN INSERT INTO restarted VALUES (NEW.id); RETURN NEW; END $$"
            )
        )
        conn.execute(
            sa.text(
                "CREATE TRIGGER note_restart AFTER UPDATE OF state ON cyclone_runs FOR EACH ROW "
                "WHEN (OLD.state IN ('failed', 'cancelled') AND NEW.state = 'running') "
                "EXECUTE FUNCTION note_restart()"
            )
        )
    with engine.connect() as conn:
        since = conn.execute(sa.text("SELECT now()")).scalar_one()
    workers = [
        cyclone.Worker(engine, workflows=[f.dispatch], concurrency=2, sweep=False) for _ in range(2)
    ]
    with engine.connect() as holder:
        # The test holds the parent: both workers claim items and wait for it, then race.
        holder.execute(
            sa.text("SELECT id FROM cyclone_runs WHERE id = :r FOR NO KEY UPDATE"), {"r": run.id}
        )
        draining = [Background(w.drain, name=f"drain-{i}") for i, w in enumerate(workers)]

        def both_wait() -> bool:
            with engine.connect() as conn:
                running = conn.execute(
                    sa.text(
                        "SELECT count(DISTINCT worker_id), count(*) FROM cyclone_jobs "
                        "WHERE run_id = :r AND state = 'running'"
                    ),
                    {"r": run.id},
                ).one()
            return running[0] == 2 and lock_waiters(engine) >= running[1]

        wait_until(both_wait, timeout=30, message="both workers waiting for the parent")
        holder.rollback()
    for d in draining:
        d.join(60)
    assert reparked(engine, run.id) == [("blocked", "running", True)] * 60
    with engine.connect() as conn:
        restarts = Counter(
            conn.execute(sa.text("SELECT run_id FROM restarted WHERE run_id <> :r"), {"r": run.id})
            .scalars()
            .all()
        )
        claimed = conn.execute(
            sa.text(
                "SELECT count(*) FROM cyclone_jobs WHERE run_id = :r AND kind = 'ship' "
                "AND item IS NOT NULL AND attempted_at > :since"
            ),
            {"r": run.id, "since": since},
        ).scalar_one()
    assert sorted(restarts) == sorted(c.id for c in run.children())
    assert set(restarts.values()) == {1}
    assert claimed < 30  # most items re-parked by a batch, not claimed one by one
    run.cancel()


def test_a_cancel_while_a_batch_reparks_the_items_leaves_no_live_job_in_the_cancelled_tree(
    engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_children, "REPARK_PER_BATCH", 100)
    f, run = cancelled_and_retried(engine, name, 12)
    first, *others = [c.id for c in run.children()]
    worker = cyclone.Worker(engine, workflows=[f.dispatch], concurrency=1, sweep=False)
    with engine.connect() as holder:
        # The steps of the children of items 1 to 11: the batch that retries them, under
        # the parent's lock, waits for the test to let it reset them.
        holder.execute(
            sa.text("SELECT id FROM cyclone_jobs WHERE run_id = ANY(:c) FOR UPDATE"),
            {"c": others},
        )
        draining = Background(worker.drain)
        wait_until(lambda: lock_waiters(engine) == 1, message="the batch waiting for the steps")
        cancelling = Background(run.cancel)
        wait_until(lambda: lock_waiters(engine) == 2, message="the cancel waiting for the parent")
        holder.rollback()
    cancelling.join(30)
    draining.join(30)
    assert run.status().state == cyclone.RunState.CANCELLED
    assert {c.status().state for c in run.children()} == {cyclone.RunState.CANCELLED}
    assert {r.state for r in item_rows(engine, run.id, "ship")} == {"cancelled"}
    with engine.connect() as conn:
        live = conn.execute(
            sa.text(
                "SELECT count(*) FROM cyclone_jobs WHERE run_id = ANY(:r) "
                "AND state IN ('available', 'blocked', 'running')"
            ),
            {"r": [run.id, first, *others]},
        ).scalar_one()
    assert live == 0
