"""The shop's workflows, found by ``manage.py cyclone worker`` in this ``workflows`` module."""

from __future__ import annotations

import msgspec
from django.db import connections

import cyclone
from shop.models import Shipment


class OrderPlaced(msgspec.Struct):
    order_id: int
    item: str
    quantity: int


fulfil = cyclone.Workflow("shop.fulfil", input=OrderPlaced)


@fulfil.step()
def reserve(ctx: cyclone.StepContext, order: OrderPlaced) -> str:
    return f"{order.quantity} x {order.item}"


@fulfil.step(after=[reserve])
def ship(ctx: cyclone.StepContext, order: OrderPlaced) -> int:
    # Steps use the ORM as views do; the worker closes stale connections around each step.
    shipment = Shipment.objects.create(order_id=order.order_id, label=ctx.output(reserve))
    return shipment.id


restock = cyclone.Workflow("shop.restock", input=str)


@restock.step(max_attempts=1)
def order_from_supplier(ctx: cyclone.StepContext, item: str) -> None:
    raise RuntimeError(f"supplier has no {item}")


payment = cyclone.Workflow("shop.payment", input=int)
"""An order that waits for its payment: a run parked on a signal, for the admin's pages."""


@payment.wait("paid")
def paid(ctx: cyclone.StepContext, cents: int) -> int:
    return cents


packing = cyclone.Workflow("shop.packing", input=list[str])
"""An order packed item by item: a map node, whose items the admin's run page lists as
one step."""


@packing.step()
def contents(ctx: cyclone.StepContext, items: list[str]) -> list[str]:
    return items


@packing.map(over=contents)
def pack(ctx: cyclone.StepContext, item: str) -> str:
    return f"packed {item}"


class Probe(msgspec.Struct):
    alias: str
    terminate: bool = False


reconnect = cyclone.Workflow("shop.reconnect", input=Probe)
"""Two steps reading their connection's server process; the first may terminate it."""


def backend_pid(alias: str) -> int:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@reconnect.step()
def first(ctx: cyclone.StepContext, probe: Probe) -> int:
    pid = backend_pid(probe.alias)
    if probe.terminate:
        # As a database restart would, from another connection; waits until it is gone.
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
    return pid


@reconnect.step(after=[first])
def second(ctx: cyclone.StepContext, probe: Probe) -> int:
    return backend_pid(probe.alias)


@cyclone.step("shop.receipt")
def send_receipt(ctx: cyclone.StepContext, order_id: int) -> str:
    """A standalone step kind: a job enqueued on its own, outside any run."""
    return f"receipt for order {order_id}"


class Refund(msgspec.Struct):
    order_id: int
    cents: int
    reason: str


@cyclone.step("shop.refund", max_attempts=2)
def refund(ctx: cyclone.StepContext, request: Refund) -> str:
    """A standalone step whose payment provider refuses: a failed job, for the admin's pages."""
    raise RuntimeError(f"the provider refused refund {request.order_id}: <b>{request.reason}</b>")
