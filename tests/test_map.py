"""Fan-out: ``@wf.map(over=node)`` runs once per item of the list ``over`` returned, each item
a job of its own, and its output is the list of the items' outputs in order."""

from __future__ import annotations

import msgspec
import sqlalchemy as sa

import cyclone


class Line(msgspec.Struct):
    sku: str
    qty: int


def order_flow(name: str) -> cyclone.ResultWorkflow[int, list[str]]:
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


def test_a_map_node_outputs_its_items_outputs_in_order(engine: sa.Engine, name: str) -> None:
    wf = order_flow(name)
    run = wf.submit(engine, 5)
    cyclone.Worker(engine, workflows=[wf], concurrency=3).drain()
    assert run.result(timeout=10) == [f"sku{i}x{i}" for i in range(5)]
