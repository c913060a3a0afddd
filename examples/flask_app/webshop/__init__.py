"""A Flask shop: ``POST /orders`` saves an order and submits its checkout in one transaction.

Run it with::

    export WEBSHOP_DATABASE_URL=postgresql://localhost/shop
    flask --app webshop init-db             # the shop's own tables and some stock
    flask --app webshop cyclone migrate     # cyclone's tables
    flask --app webshop run                 # the web application
    flask --app webshop cyclone worker      # the worker, in another terminal

The application serves cyclone's dashboard at /cyclone; operators may act on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import flask
import msgspec
from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert

import cyclone
from cyclone.contrib.flask import Cyclone, database_url

from .models import Order, Stock, db
from .workflows import OrderIn, Receipt, checkout


def operators_only(request: flask.Request) -> bool:
    """Who may retry and cancel on the dashboard: the shop's login keeps a role in the session."""
    return flask.session.get("role") == "operator"


cy = Cyclone(dashboard="/cyclone", authorize=operators_only)


class OutOfStock(Exception):
    pass


def create_app(config: Mapping[str, Any] | None = None) -> flask.Flask:
    app = flask.Flask(__name__)
    app.config.from_mapping(CYCLONE_WORKER_MODULES=["webshop.workflows"])
    if "WEBSHOP_DATABASE_URL" in os.environ:
        app.config["SQLALCHEMY_DATABASE_URI"] = database_url(os.environ["WEBSHOP_DATABASE_URL"])
    if "WEBSHOP_SECRET_KEY" in os.environ:  # signs the session (and the dashboard's forms)
        app.config["SECRET_KEY"] = os.environ["WEBSHOP_SECRET_KEY"]
    app.config.from_mapping(config or {})
    db.init_app(app)
    cy.init_app(app)
    app.register_blueprint(orders)
    app.cli.command("init-db")(init_db)
    return app


def init_db() -> None:
    """Create the shop's tables and stock some widgets."""
    db.create_all()
    db.session.execute(
        insert(Stock).values(item="widget", available=100, price_cents=250).on_conflict_do_nothing()
    )
    db.session.commit()


orders = flask.Blueprint("orders", __name__)


@orders.post("/orders")
def create_order() -> tuple[dict[str, Any], int]:
    key = flask.request.headers.get("Idempotency-Key")
    if not key:
        return {"error": "send an Idempotency-Key header"}, 400
    body = flask.request.get_json()
    item, quantity = str(body["item"]), int(body["quantity"])
    # The order row is made once per Idempotency-Key; a retry finds it (and waits for a
    # concurrent first try to commit or roll back).
    order = (
        db.session.scalar(
            insert(Order)
            .values(idempotency_key=key, item=item, quantity=quantity)
            .on_conflict_do_nothing(index_elements=[Order.idempotency_key])
            .returning(Order)
        )
        or db.session.scalars(select(Order).filter_by(idempotency_key=key)).one()
    )
    if (order.item, order.quantity) != (item, quantity):
        return {"error": "this Idempotency-Key was used for another order"}, 422
    run, created = checkout.submit_once_tx(
        db.session, f"order:{order.id}", OrderIn(order.id, order.item, order.quantity)
    )
    if created:
        order.run_id = run.id
        reserve(item, quantity)  # raises OutOfStock: the order and its run roll back
    db.session.commit()
    return {"order_id": order.id, "run_id": str(run.id)}, 201 if created else 200


def reserve(item: str, quantity: int) -> None:
    taken = db.session.execute(
        update(Stock)
        .where(Stock.item == item, Stock.available >= quantity)
        .values(available=Stock.available - quantity)
    )
    if taken.rowcount != 1:  # type: ignore[attr-defined]
        raise OutOfStock(item)


@orders.errorhandler(OutOfStock)
def out_of_stock(exc: OutOfStock) -> tuple[dict[str, Any], int]:
    # Raised after the submit: Flask-SQLAlchemy ends the request's session uncommitted,
    # so neither the order nor its run exists, and the Idempotency-Key is free again.
    return {"error": f"out of stock: {exc}"}, 409


@orders.get("/orders/<int:order_id>")
def show_order(order_id: int) -> dict[str, Any]:
    order = db.get_or_404(Order, order_id)
    assert order.run_id is not None  # an order is committed with its run
    run: cyclone.ResultRun[Receipt] = cyclone.ResultRun(
        cy.engine, order.run_id, checkout.name, f"order:{order.id}", Receipt
    )
    status = run.status()
    done = status.state == cyclone.RunState.COMPLETED
    return {
        "order_id": order.id,
        "status": order.status,
        "run": {"id": str(run.id), "state": status.state.value, "error": status.error},
        "result": msgspec.to_builtins(run.result()) if done else None,
    }
