from __future__ import annotations

import msgspec
import sqlalchemy as sa

import cyclone


class Order(msgspec.Struct):
    id: int
    amount: int


def test_a_result_workflow_runs_end_to_end(engine: sa.Engine, name: str) -> None:
    wf = cyclone.ResultWorkflow(name, input=Order, output=int)

    @wf.step()
    def double(ctx: cyclone.StepContext, order: Order) -> int:
        return order.amount * 2

    @wf.result(after=[double])
    def total(ctx: cyclone.StepContext, order: Order) -> int:
        return ctx.output(double) + 1

    run, created = wf.submit_once(engine, "order:1", Order(1, 10))
    assert created
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 2
    assert run.result(timeout=10) == 21
