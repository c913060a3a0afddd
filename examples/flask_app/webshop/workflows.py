"""The checkout workflow; its steps run in the app's context and use ``db.session``."""

from __future__ import annotations

import msgspec

import cyclone

from .models import Order, Stock, db


class OrderIn(msgspec.Struct):
    order_id: int
    item: str
    quantity: int


class Receipt(msgspec.Struct):
    order_id: int
    amount_cents: int
    status: str


checkout = cyclone.ResultWorkflow("webshop.checkout", input=OrderIn, output=Receipt)


@checkout.step()
def price(ctx: cyclone.StepContext, order: OrderIn) -> int:
    stock = db.session.get_one(Stock, order.item)
    return stock.price_cents * order.quantity


@checkout.result(after=[price])
def confirm(ctx: cyclone.StepContext, order: OrderIn) -> Receipt:
    row = db.session.get_one(Order, order.order_id)
    row.status = "confirmed"  # idempotent: a step may run more than once
    db.session.commit()
    return Receipt(order_id=row.id, amount_cents=ctx.output(price), status=row.status)
