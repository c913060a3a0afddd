"""The shop that docs/cli.md and the README's terminal session operate with ``cyclone``.

``cyclone worker shop`` runs what this module defines (and registers the daily
``restock`` schedule); ``python shop.py`` submits three checkouts (the third one's charge
fails) and enqueues two emails (the second one a day ahead, so it is still waiting when
the session cancels it).
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

import cyclone

checkout = cyclone.ResultWorkflow("checkout", output=str)


@checkout.step()
def reserve(ctx: cyclone.StepContext, order: dict[str, Any]) -> int:
    return int(order["quantity"])


@checkout.step(after=[reserve], max_attempts=1)
def charge(ctx: cyclone.StepContext, order: dict[str, Any]) -> int:
    if order["sku"] == "broken":
        raise RuntimeError(f"card declined for order {order['id']}")
    return ctx.output(reserve) * int(order["cents"])


@checkout.result(after=[charge])
def confirm(ctx: cyclone.StepContext, order: dict[str, Any]) -> str:
    return f"order {order['id']} paid {ctx.output(charge)} cents"


restock = cyclone.Workflow("restock")


@restock.step()
def count_stock(ctx: cyclone.StepContext, store: dict[str, str]) -> str:
    return f"counted {store['name']}"


restock.schedule("restock", every=timedelta(days=1), input={"name": "main"})


@cyclone.step("send_email", queue="mail")
def send_email(ctx: cyclone.StepContext, email: dict[str, str]) -> None:
    print(f"to {email['to']}: {email['subject']}")


def main() -> None:
    url = sa.make_url(os.environ["CYCLONE_DATABASE_URL"])
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    engine = sa.create_engine(url)
    for number, sku in [(1, "tea"), (2, "cake"), (3, "broken")]:
        order = {"id": number, "sku": sku, "quantity": 2, "cents": 450}
        checkout.submit_once(engine, f"order-{number}", order)
    send_email.enqueue(engine, {"to": "ada@example.com", "subject": "welcome"})
    send_email.enqueue(
        engine, {"to": "bob@example.com", "subject": "reminder"}, delay=timedelta(days=1)
    )
    engine.dispose()
    print("submitted 3 checkouts and 2 emails")


if __name__ == "__main__":
    main()
