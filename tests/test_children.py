"""Child runs: ``@wf.child(workflow)`` submits exactly one run of ``workflow`` per node of a
run, waits for it holding no worker, and completes with its result or fails naming it."""

from __future__ import annotations

from typing import Any

import msgspec
import sqlalchemy as sa

import cyclone


class Order(msgspec.Struct):
    lines: list[int]


class Shipment(msgspec.Struct):
    parcels: int


class Outcome:
    """What a child's step does, shared by a test and its definitions."""

    def __init__(self) -> None:
        self.fail = False
        self.calls = 0


def shop(
    name: str, outcome: Outcome | None = None
) -> tuple[cyclone.Workflow[Order], cyclone.ResultWorkflow[int, Shipment]]:
    """checkout: reserve -> ship (child: shipping) -> done, reading ship's output."""
    outcome = outcome or Outcome()
    shipping: cyclone.ResultWorkflow[int, Shipment] = cyclone.ResultWorkflow(
        f"{name}-shipping", input=int, output=Shipment
    )

    @shipping.result()
    def pack(ctx: cyclone.StepContext, parcels: int) -> Shipment:
        outcome.calls += 1
        if outcome.fail:
            raise RuntimeError("no boxes left")
        return Shipment(parcels=parcels)

    checkout: cyclone.Workflow[Order] = cyclone.Workflow(f"{name}-checkout", input=Order)

    @checkout.step()
    def reserve(ctx: cyclone.StepContext, order: Order) -> int:
        return len(order.lines)

    @checkout.child(shipping, after=[reserve])
    def ship(ctx: cyclone.StepContext, order: Order) -> int:
        return ctx.output(reserve) * 2

    @checkout.step(after=[ship])
    def done(ctx: cyclone.StepContext, order: Order) -> int:
        shipment = ctx.output(ship)
        assert isinstance(shipment, Shipment)
        return shipment.parcels

    return checkout, shipping


def step_output(engine: sa.Engine, run_id: Any, kind: str) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.text("SELECT output FROM cyclone_jobs WHERE run_id = :r AND kind = :k"),
            {"r": run_id, "k": kind},
        ).scalar_one()


def test_a_child_nodes_output_is_its_childs_result_read_downstream(
    engine: sa.Engine, name: str
) -> None:
    checkout, shipping = shop(name)
    run = checkout.submit(engine, Order(lines=[1, 2, 3]))
    cyclone.Worker(engine, workflows=[checkout, shipping]).drain()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    (child,) = run.children()
    assert child.workflow == shipping.name
    status = child.status()
    assert status.parent_id == run.id
    assert status.state == cyclone.RunState.COMPLETED
    assert step_output(engine, run.id, "ship") == {"parcels": 6}
    assert step_output(engine, run.id, "done") == 6
