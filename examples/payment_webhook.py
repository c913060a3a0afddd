"""A checkout that waits for the payment provider's webhook, then ships.

Run it with ``CYCLONE_DATABASE_URL=postgresql+psycopg://... python examples/payment_webhook.py``.

The workflow reserves stock, then waits at the ``paid`` node: the run is parked in the
database and holds no worker. The webhook handler (a plain function here; in Flask it is
the body of a ``@app.post("/webhooks/payments")`` view) records the payment in the
application's own table and sends the signal in the same transaction, so either both
happen or neither. Providers retry webhooks: the same payload again is a no-op.
"""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

import cyclone

URL = os.environ.get(
    "CYCLONE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
engine = sa.create_engine(URL)

app_metadata = sa.MetaData()
payments = sa.Table(
    "example_webhook_payments",
    app_metadata,
    sa.Column("ref", sa.Text, primary_key=True),
    sa.Column("order_id", sa.Text, nullable=False),
    sa.Column("cents", sa.Integer, nullable=False),
)


class Order(msgspec.Struct):
    order_id: str
    cents: int


class Payment(msgspec.Struct):
    ref: str
    cents: int


checkout = cyclone.ResultWorkflow("example-paid-checkout", input=Order, output=str)


@checkout.step()
def reserve(ctx: cyclone.StepContext, order: Order) -> str:
    return f"stock held for order {order.order_id}"


@checkout.wait("paid", after=[reserve], timeout=timedelta(days=1))
def paid(ctx: cyclone.StepContext, payment: Payment) -> Payment:
    return payment


@checkout.result(after=[reserve, paid])
def ship(ctx: cyclone.StepContext, order: Order) -> str:
    payment = ctx.output(paid)
    if payment.cents != order.cents:
        raise ValueError(f"paid {payment.cents}, owed {order.cents}")
    return f"order {order.order_id} shipped ({ctx.output(reserve)}, payment {payment.ref})"


def handle_payment_webhook(body: dict[str, Any]) -> str:
    """What the webhook view does: record the payment and signal the run, in one transaction."""
    with engine.begin() as conn:
        conn.execute(
            insert(payments)
            .values(ref=body["ref"], order_id=body["order_id"], cents=body["cents"])
            .on_conflict_do_nothing()
        )
        stored = checkout.signal_tx(
            conn, f"order:{body['order_id']}", "paid", Payment(body["ref"], body["cents"])
        )
    return "signalled" if stored else "already signalled"


def main() -> None:
    cyclone.upgrade(engine)
    app_metadata.create_all(engine)
    order = Order(order_id=uuid.uuid4().hex[:8], cents=4200)
    run, _ = checkout.submit_once(engine, f"order:{order.order_id}", order)

    worker = cyclone.Worker(engine, workflows=[checkout], poll_interval=1)
    serving = threading.Thread(target=worker.run)
    serving.start()
    try:
        body = {"ref": f"pay_{order.order_id}", "order_id": order.order_id, "cents": 4200}
        print(handle_payment_webhook(body))
        print(handle_payment_webhook(body))  # the provider's retry: a no-op
        print(run.result(timeout=30))
        found = checkout.get_run(engine, f"order:{order.order_id}")
        assert found is not None
        assert found.status().state == cyclone.RunState.COMPLETED
    finally:
        worker.stop()
        serving.join()
        engine.dispose()


if __name__ == "__main__":
    main()
