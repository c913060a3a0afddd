"""A checkout workflow end to end: submit once per order, run it with a worker, read the result.

Run it with ``scripts/demo`` (which finds or starts PostgreSQL), or directly with
``CYCLONE_DATABASE_URL=postgresql+psycopg://... python examples/checkout.py``.

Steps run at least once: a worker that dies mid-step hands the step to another worker,
which runs it again. The steps here are idempotent in the two usual ways: ``charge``
writes its effect under a unique key derived from the run (``ON CONFLICT DO NOTHING``),
so a second attempt finds the first one's charge; ``reserve`` only computes.
"""

from __future__ import annotations

import os
import threading
import uuid

import msgspec
import sqlalchemy as sa

import cyclone

URL = os.environ.get(
    "CYCLONE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


class Order(msgspec.Struct):
    order_id: str
    sku: str
    quantity: int
    unit_cents: int


class Reservation(msgspec.Struct):
    sku: str
    quantity: int


class Receipt(msgspec.Struct):
    charge_id: str
    cents: int


class Confirmation(msgspec.Struct):
    order_id: str
    charge_id: str
    cents: int
    shipped: bool


checkout = cyclone.ResultWorkflow("example.checkout", input=Order, output=Confirmation)
engine = sa.create_engine(URL)
payments = sa.Table(
    "example_payments",
    sa.MetaData(),
    sa.Column("charge_key", sa.Text, primary_key=True),
    sa.Column("charge_id", sa.Text, nullable=False),
    sa.Column("cents", sa.Integer, nullable=False),
)


@checkout.step()
def reserve(ctx: cyclone.StepContext, order: Order) -> Reservation:
    return Reservation(sku=order.sku, quantity=order.quantity)


@checkout.step(after=[reserve], max_attempts=5)
def charge(ctx: cyclone.StepContext, order: Order) -> Receipt:
    reservation = ctx.output(reserve)
    cents = reservation.quantity * order.unit_cents
    key = f"{ctx.run_id}:charge"  # the same on every attempt of this step of this run
    with engine.begin() as conn:
        conn.execute(
            sa.dialects.postgresql.insert(payments)
            .values(charge_key=key, charge_id=f"ch_{uuid.uuid4().hex[:12]}", cents=cents)
            .on_conflict_do_nothing()
        )
        charge_id = conn.execute(
            sa.select(payments.c.charge_id).where(payments.c.charge_key == key)
        ).scalar_one()
    return Receipt(charge_id=charge_id, cents=cents)


@checkout.step(after=[reserve])
def pack(ctx: cyclone.StepContext, order: Order) -> bool:
    return ctx.output(reserve).quantity > 0


@checkout.result(after=[charge, pack])
def confirm(ctx: cyclone.StepContext, order: Order) -> Confirmation:
    receipt = ctx.output(charge)
    return Confirmation(
        order_id=order.order_id,
        charge_id=receipt.charge_id,
        cents=receipt.cents,
        shipped=ctx.output(pack),
    )


def main() -> None:
    cyclone.upgrade(engine)
    payments.create(engine, checkfirst=True)
    order = Order(order_id=uuid.uuid4().hex[:8], sku="tea-42", quantity=3, unit_cents=450)
    key = f"order:{order.order_id}"

    run, created = checkout.submit_once(engine, key, order)
    print(f"submitted {key}: run {run.id} (created={created})")
    again, created_again = checkout.submit_once(engine, key, order)
    print(f"retried   {key}: run {again.id} (created={created_again})")
    if again.id != run.id or not created or created_again:
        raise SystemExit("submit_once did not return the key's one run")

    try:
        checkout.submit_once(engine, key, Order(order.order_id, "tea-42", 4, 450))
    except cyclone.SubmitConflictError as conflict:
        print(f"different input for the same key is refused: {conflict}")

    worker = cyclone.Worker(engine, workflows=[checkout], concurrency=4)
    thread = threading.Thread(target=worker.run, name="example-worker")
    thread.start()
    try:
        confirmation = run.result(timeout=30)
    finally:
        worker.stop()
        thread.join(timeout=30)
    print(f"result: {confirmation}")
    print(f"status: {run.status().state.value}")
    if confirmation.cents != 1350 or not confirmation.shipped:
        raise SystemExit(f"unexpected result {confirmation}")


if __name__ == "__main__":
    main()
