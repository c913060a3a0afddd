"""The workflow of the fork tests, defined alike in the tests and in their subprocesses."""

from __future__ import annotations

from collections import Counter

import msgspec

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
