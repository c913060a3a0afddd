"""Forking a run onto the code that fixes it (``run.fork``), through the public API."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

import cyclone


class Order(msgspec.Struct):
    id: int
    cents: int


def three_steps(name: str, calls: Counter[str], *, fixed: bool) -> cyclone.Workflow[Order]:
    """``charge -> label -> notify``; ``label`` raises unless ``fixed`` (the deploy)."""
    wf = cyclone.Workflow(name, input=Order)

    @wf.step(max_attempts=1)
    def charge(ctx: cyclone.StepContext, order: Order) -> str:
        calls["charge"] += 1  # the side effect that must not happen twice
        return f"receipt-{order.id}"

    @wf.step(after=[charge], max_attempts=1)
    def label(ctx: cyclone.StepContext, order: Order) -> str:
        calls["label"] += 1
        if not fixed:
            raise ValueError("label printer bug")
        return f"label for {ctx.output(charge)}"

    @wf.step(after=[label], max_attempts=1)
    def notify(ctx: cyclone.StepContext, order: Order) -> str:
        calls["notify"] += 1
        return f"sent {ctx.output(label)}"

    return wf


def drain(engine: sa.Engine, wf: cyclone.Workflow[Any]) -> None:
    with cyclone.Worker(engine, workflows=[wf]) as worker:
        worker.drain()


def steps_of(engine: sa.Engine, run_id: uuid.UUID) -> dict[str, tuple[str, Any]]:
    detail = cyclone.Client(engine).get_run_detail(run_id)
    assert detail is not None
    return {s.name: (s.state.value, s.output) for s in detail.steps}


def test_a_fork_onto_the_fixed_definition_keeps_completed_steps_and_runs_the_rest(
    engine: sa.Engine, name: str
) -> None:
    calls: Counter[str] = Counter()
    buggy = three_steps(name, calls, fixed=False)
    run, _ = buggy.submit_once(engine, "order:1", Order(1, 500))
    drain(engine, buggy)
    assert run.status().state == cyclone.RunState.FAILED
    assert calls == {"charge": 1, "label": 1}

    fixed = three_steps(name, calls, fixed=True)  # the deploy: same name, label corrected
    fork, created = fixed.run(engine, run.id).fork("order:1:fixed", rerun=[fixed.steps["label"]])
    assert created
    assert fork.status().forked_from == run.id
    drain(engine, fixed)

    assert fork.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert calls == {"charge": 1, "label": 2, "notify": 1}
    assert steps_of(engine, fork.id) == {
        "charge": ("completed", "receipt-1"),
        "label": ("completed", "label for receipt-1"),
        "notify": ("completed", "sent label for receipt-1"),
    }
