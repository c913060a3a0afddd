"""Helpers of the dashboard tests: a four-step workflow whose middle step fails on demand."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import sqlalchemy as sa

import cyclone


class Order(msgspec.Struct):
    order_id: int
    note: str = ""


class CardDeclined(Exception):
    pass


@dataclass
class Shop:
    """``fetch -> (charge, notify) -> ship``; ``charge`` raises while ``failing`` is True."""

    workflow: cyclone.ResultWorkflow[Order, str]
    failing: list[bool] = field(default_factory=lambda: [True])

    def worker(self, engine: sa.Engine) -> cyclone.Worker:
        return cyclone.Worker(engine, workflows=[self.workflow], backoff=lambda attempt: 0.0)


def shop(name: str, *, message: str = "card declined") -> Shop:
    wf: cyclone.ResultWorkflow[Order, str] = cyclone.ResultWorkflow(name, input=Order, output=str)
    state = Shop(wf)

    @wf.step()
    def fetch(ctx: cyclone.StepContext, order: Order) -> int:
        return order.order_id

    @wf.step(after=[fetch], max_attempts=2)
    def charge(ctx: cyclone.StepContext, order: Order) -> str:
        if state.failing[0]:
            raise CardDeclined(message)
        return f"charged {order.order_id}"

    @wf.step(after=[fetch])
    def notify(ctx: cyclone.StepContext, order: Order) -> None:
        return None

    @wf.result(after=[charge, notify])
    def ship(ctx: cyclone.StepContext, order: Order) -> str:
        return f"shipped {ctx.output(charge)}"

    return state


def csrf_token(html: str) -> str:
    """The CSRF token of the first action form on a page."""
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match is not None, "the page has no action form"
    return match.group(1)


def text_of(html: str) -> str:
    """The page without tags, white space collapsed (what a reader sees)."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def as_dict(value: Any) -> Any:
    return msgspec.to_builtins(value)
