"""The shop's tables, in Flask-SQLAlchemy models."""

from __future__ import annotations

import uuid

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    """An order; ``idempotency_key`` is the client's ``Idempotency-Key`` of the POST."""

    __tablename__ = "webshop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(unique=True)
    item: Mapped[str]
    quantity: Mapped[int]
    status: Mapped[str] = mapped_column(default="pending")
    run_id: Mapped[uuid.UUID | None]


class Stock(db.Model):  # type: ignore[name-defined,misc]
    """What is left of an item, and its price."""

    __tablename__ = "webshop_stock"

    item: Mapped[str] = mapped_column(primary_key=True)
    available: Mapped[int]
    price_cents: Mapped[int]
