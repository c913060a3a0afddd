"""Workflows of the child-run tests, defined by name so that a worker process serves the
very definitions its test submits with.

``shop(name)``: ``{name}-checkout`` (input :class:`Order`) runs ``reserve``, then the
child node ``ship`` (a run of ``{name}-shipping``, a ResultWorkflow of :class:`Shipment`
whose input is twice the number of lines), then ``done``, which returns the child's
parcels read through ``ctx.output(ship)``. The shipping step fails while
``outcome.fail`` is set, and blocks on a signal ``go`` when ``outcome.hold`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

import cyclone


class Order(msgspec.Struct):
    lines: list[int]


class Shipment(msgspec.Struct):
    parcels: int


@dataclass
class Outcome:
    """What the child's step does, shared by a test and its definitions."""

    fail: bool = False
    calls: list[int] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Shop:
    checkout: cyclone.Workflow[Order]
    shipping: cyclone.ResultWorkflow[int, Shipment]
    outcome: Outcome

    @property
    def workflows(self) -> list[cyclone.Workflow[object]]:
        return [self.checkout, self.shipping]  # type: ignore[list-item]


def shop(name: str, *, hold: bool = False, max_attempts: int = 1) -> Shop:
    outcome = Outcome()
    shipping: cyclone.ResultWorkflow[int, Shipment] = cyclone.ResultWorkflow(
        f"{name}-shipping", input=int, output=Shipment
    )
    after: list[cyclone.Step[object]] = []
    if hold:

        @shipping.wait("go")
        def go(ctx: cyclone.StepContext, payload: int) -> int:
            return payload

        after = [go]

    @shipping.result(after=after, max_attempts=1)
    def pack(ctx: cyclone.StepContext, parcels: int) -> Shipment:
        outcome.calls.append(parcels)
        if outcome.fail:
            raise RuntimeError("no boxes left")
        return Shipment(parcels=parcels)

    checkout: cyclone.Workflow[Order] = cyclone.Workflow(f"{name}-checkout", input=Order)

    @checkout.step()
    def reserve(ctx: cyclone.StepContext, order: Order) -> int:
        return len(order.lines)

    @checkout.child(shipping, after=[reserve], max_attempts=max_attempts)
    def ship(ctx: cyclone.StepContext, order: Order) -> int:
        outcome.inputs.append(ctx.output(reserve))
        return ctx.output(reserve) * 2

    @checkout.step(after=[ship])
    def done(ctx: cyclone.StepContext, order: Order) -> int:
        shipment = ctx.output(ship)
        assert isinstance(shipment, Shipment)
        return shipment.parcels

    return Shop(checkout, shipping, outcome)


@dataclass
class FleetOutcome:
    """What the children of a map of children do, shared by a test and its definitions."""

    broken: set[int] = field(default_factory=set)
    submitted: list[int] = field(default_factory=list)
    packed: list[int] = field(default_factory=list)
    orders: int | None = None
    """When set, ``orders`` returns at most this many orders."""


@dataclass(frozen=True)
class Fleet:
    dispatch: cyclone.Workflow[int]
    parcel: cyclone.ResultWorkflow[int, int]
    outcome: FleetOutcome

    @property
    def workflows(self) -> list[cyclone.Workflow[object]]:
        return [self.dispatch, self.parcel]  # type: ignore[list-item]


def fleet(name: str, *, hold: bool = False) -> Fleet:
    """``{name}-dispatch`` (input n): ``orders`` returns ``[0..n)``, the map of children
    ``ship`` submits one ``{name}-parcel`` run per order (its input ``10 * order``), and
    ``total`` sums the children's results. A parcel fails while its input's order is in
    ``outcome.broken``, and waits for the signal ``go`` when ``hold``."""
    outcome = FleetOutcome()
    parcel: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(
        f"{name}-parcel", input=int, output=int
    )
    after: list[cyclone.Step[object]] = []
    if hold:

        @parcel.wait("go")
        def go(ctx: cyclone.StepContext, payload: int) -> int:
            return payload

        after = [go]

    @parcel.result(after=after, max_attempts=1)
    def pack(ctx: cyclone.StepContext, n: int) -> int:
        outcome.packed.append(n)
        if n // 10 in outcome.broken:
            raise RuntimeError(f"parcel {n} is broken")
        return n + 1

    dispatch: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-dispatch", input=int)

    @dispatch.step()
    def orders(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n if outcome.orders is None else min(n, outcome.orders)))

    @dispatch.child(parcel, over=orders)
    def ship(ctx: cyclone.StepContext, order: int) -> int:
        outcome.submitted.append(order)
        return 10 * order

    @dispatch.step(after=[ship])
    def total(ctx: cyclone.StepContext, n: int) -> list[int]:
        results: list[int] = ctx.output(ship)
        return results

    return Fleet(dispatch, parcel, outcome)
