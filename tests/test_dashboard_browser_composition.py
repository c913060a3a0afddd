"""Child runs and maps on the dashboard, in a real headless browser: an operator follows a
parent's child node to the child run and back, reads a map node's progress, and sees a
map of children's first children in item order with a count of the rest.

The runs are made by a real worker before the pages load; pages are awaited with
Playwright's ``expect``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

import cyclone
from cyclone.dashboard import create_app
from tests.support.browser import chromium, serve
from tests.support.child_defs import fleet


@pytest.fixture
def live_url(engine: sa.Engine) -> Iterator[str]:
    with serve(create_app(engine)) as url:
        yield url


@pytest.fixture
def page(live_url: str) -> Iterator[Any]:
    with chromium(javascript=False) as found:
        yield found


def test_a_parent_run_page_leads_to_its_child_run_and_the_child_back_to_its_parent(
    engine: sa.Engine, live_url: str, page: Any, name: str
) -> None:
    shipping: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(
        f"{name}-shipping", input=int, output=int
    )

    @shipping.result()
    def pack(ctx: cyclone.StepContext, parcels: int) -> int:
        return parcels

    checkout: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-checkout", input=int)

    @checkout.child(shipping)
    def ship(ctx: cyclone.StepContext, lines: int) -> int:
        return lines

    run = checkout.submit(engine, 3)
    cyclone.Worker(engine, workflows=[checkout, shipping]).drain()
    assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    (child,) = run.children()

    page.goto(f"{live_url}/runs/{run.id}")
    to_child = page.locator(f"dd.step-child a[href='/runs/{child.id}']")
    expect(to_child).to_be_visible()
    to_child.click()
    expect(page).to_have_url(re.compile(rf"/runs/{child.id}$"))
    expect(page.get_by_text("child node ship")).to_be_visible()

    page.locator(f"a[href='/runs/{run.id}']").first.click()
    expect(page).to_have_url(re.compile(rf"/runs/{run.id}$"))
    expect(page.locator(f"a[href='/runs/{child.id}']").first).to_be_visible()


def test_a_map_nodes_progress_reads_items_done_of_total_on_the_run_page(
    engine: sa.Engine, live_url: str, page: Any, name: str
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-map", input=int)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers, max_attempts=1)
    def double(ctx: cyclone.StepContext, i: int) -> int:
        if i == 3:
            raise ValueError("item 3 is broken")
        return 2 * i

    run = wf.submit(engine, 5)
    cyclone.Worker(engine, workflows=[wf], concurrency=1).drain()
    assert run.wait(timeout=30).state == cyclone.RunState.FAILED
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    (node,) = [s for s in detail.steps if s.name == "double"]
    assert node.items_total == 5
    done = node.items_done
    assert done is not None
    assert done < 5

    page.goto(f"{live_url}/runs/{run.id}")
    expect(page.get_by_text(f"{done}/5 items").first).to_be_visible()
    expect(page.locator("dd.items").first).to_have_text(f"{done} of 5 done")
    expect(page.get_by_text("item 3 is broken").first).to_be_visible()


def test_a_map_of_children_lists_its_first_children_in_item_order_and_counts_the_rest(
    engine: sa.Engine, live_url: str, page: Any, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cyclone.dashboard._app.CHILDREN_SHOWN", 2)
    f = fleet(name)
    run = f.dispatch.submit(engine, 4)
    cyclone.Worker(engine, workflows=f.workflows).drain()
    assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED

    page.goto(f"{live_url}/runs/{run.id}")
    listed = page.locator("section.run-family li.run-child")
    expect(listed).to_have_count(2)
    expect(listed.nth(0)).to_contain_text("item 0")
    expect(listed.nth(1)).to_contain_text("item 1")
    expect(page.locator("section.run-family li.run-more")).to_have_text(
        "and 2 more children, not listed here"
    )
    listed.nth(1).locator("a").click()
    expect(page.get_by_text("its child node ship item 1 submitted this run")).to_be_visible()
