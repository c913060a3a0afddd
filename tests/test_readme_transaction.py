"""The README's "In your transaction" section, run block by block as written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    scoped_session,
    sessionmaker,
)

import cyclone
from tests.support import docs

README = Path(__file__).resolve().parent.parent / "README.md"


def section_blocks() -> list[str]:
    return docs.blocks(
        "README.md", "## In your transaction (Flask, Django, a shared Session, plain psycopg)"
    )


class Base(DeclarativeBase):
    pass


class OrderRow(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)


class Order(msgspec.Struct):
    order_id: str
    cents: int


@pytest.fixture
def engine(fresh_database: URL) -> Iterator[sa.Engine]:
    """A database of its own: the section uses the workflow name ``checkout``."""
    engine = sa.create_engine(fresh_database)
    cyclone.upgrade(engine)
    Base.metadata.create_all(engine)
    yield engine
    cyclone.close(engine)
    engine.dispose()


def test_the_section_has_a_block_per_bind_kind() -> None:
    blocks = section_blocks()
    assert len(blocks) == 3
    assert "Session(engine)" in blocks[0]
    assert "scoped_session" in blocks[1]
    assert "psycopg.connect" in blocks[2]


def test_every_block_of_the_section_runs_and_commits_with_the_callers_rows(
    engine: sa.Engine, fresh_database: URL
) -> None:
    checkout: cyclone.Workflow[Order] = cyclone.Workflow("checkout", input=Order)
    checkout.step("charge")(lambda ctx, order: None)
    namespace: dict[str, Any] = {
        "engine": engine,
        "checkout": checkout,
        "order": Order("42", 1999),
        "order_row": OrderRow(id=42),
        "Session": Session,
        "scoped_session": scoped_session,
        "sessionmaker": sessionmaker,
        "psycopg": psycopg,
        "conninfo": fresh_database.set(drivername="postgresql").render_as_string(
            hide_password=False
        ),
    }
    for block in section_blocks():
        exec(block, namespace)
    assert namespace["run"].status().state == cyclone.RunState.RUNNING
    client = cyclone.Client(engine)
    keys = {status.key for status in client.list_runs(workflow="checkout")}
    assert keys == {"order:42", "order:43", "order:44"}
    with engine.connect() as conn:
        assert set(conn.execute(sa.select(OrderRow.id)).scalars()) == {42, 44}


def test_the_first_block_rolled_back_frees_the_key(engine: sa.Engine) -> None:
    checkout: cyclone.Workflow[Order] = cyclone.Workflow("checkout", input=Order)
    checkout.step("charge")(lambda ctx, order: None)
    order = Order("42", 1999)
    with Session(engine) as session:
        session.begin()
        session.add(OrderRow(id=42))
        session.flush()
        checkout.submit_once_tx(session, "order:42", order)
        session.rollback()  # the request failed after the submit
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(OrderRow)).scalar() == 0
    _run, created = checkout.submit_once(engine, "order:42", order)
    assert created
