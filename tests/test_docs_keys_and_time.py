"""The code blocks of docs/keys.md, docs/schedules.md, docs/signals.md and the README's
"Keys and time" section run, in order, against the test database."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def run_blocks(blocks: list[str], namespace: dict[str, Any], where: str) -> None:
    assert blocks, f"no python blocks in {where}"
    for i, block in enumerate(blocks):
        exec(compile(block, f"{where} block {i + 1}", "exec"), namespace)


@pytest.mark.parametrize("page", ["keys.md", "schedules.md", "signals.md"])
def test_doc_page_blocks_run_in_order(
    database_url: URL, monkeypatch: pytest.MonkeyPatch, page: str
) -> None:
    monkeypatch.setenv("CYCLONE_DATABASE_URL", database_url.render_as_string(hide_password=False))
    namespace: dict[str, Any] = {"__name__": f"docs_{page[:-3]}"}
    try:
        run_blocks(python_blocks((ROOT / "docs" / page).read_text()), namespace, page)
    finally:
        engine = namespace.get("engine")
        if isinstance(engine, sa.Engine):
            engine.dispose()


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Keys and time")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_readme_keys_and_time_blocks_run(engine: sa.Engine, name: str) -> None:
    """The README's section runs after a prelude defining what the README's earlier
    sections define (an engine, an order, and the checkout and reports workflows)."""
    prelude = f'''
from datetime import timedelta

import msgspec
from sqlalchemy.orm import Session

import cyclone


class Order(msgspec.Struct):
    order_id: str
    cents: int


class Payment(msgspec.Struct):
    ref: str
    cents: int


checkout = cyclone.Workflow("{name}-checkout", input=Order)


@checkout.step()
def charge(ctx: cyclone.StepContext, order: Order) -> None:
    return None


reports = cyclone.Workflow("{name}-reports", input=dict)
reports.step()(lambda ctx, params: None)
order = Order(order_id="42", cents=4200)
checkout.submit_once(engine, "order:42", order)
'''
    namespace: dict[str, Any] = {"engine": engine, "__name__": "readme"}
    run_blocks([prelude, *python_blocks(readme_section())], namespace, "README.md")
