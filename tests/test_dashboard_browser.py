"""The dashboard in a real headless browser: Debian's chromium driven by Playwright.

From the overview an operator follows a failed run to its DAG, reads the error, presses
retry, and after a worker drains sees the run completed (JavaScript off: every page works
without it). With JavaScript on, an open page shows a run's new state without a reload,
and holds off while the operator is in a form or the tab is hidden. Screenshots of each
stage are saved under ``tests/.artifacts/``; with ``CYCLONE_UPDATE_SCREENSHOT=1`` the run
page also replaces ``docs/dashboard.png``, the README's picture.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

import cyclone
from cyclone.dashboard import create_app
from tests.support.browser import chromium, doc_shot, serve, shot
from tests.support.dashboard import Order, shop


@pytest.fixture
def live_url(engine: sa.Engine) -> Iterator[str]:
    """The dashboard served over HTTP on a free port, actions allowed."""
    with serve(create_app(engine, authorize=lambda e: True)) as url:
        yield url


@pytest.fixture
def live_js_url(engine: sa.Engine) -> Iterator[str]:
    """The dashboard over HTTP, its pages refreshing themselves every 0.2 s."""
    with serve(create_app(engine, authorize=lambda e: True, refresh=0.2)) as url:
        yield url


@pytest.fixture
def page(live_url: str) -> Iterator[Any]:
    with chromium(javascript=False) as found:
        yield found


@pytest.fixture
def js_page(live_js_url: str) -> Iterator[Any]:
    with chromium(javascript=True) as found:
        yield found


def test_operator_follows_a_failed_run_to_its_dag_retries_it_and_sees_it_complete(
    engine: sa.Engine, live_url: str, page: Any, name: str
) -> None:
    workflow = f"checkout-{name[1:7]}"
    s = shop(workflow)
    s.failing[0] = False
    for i in range(3):
        s.workflow.submit_once(engine, f"order:{100 + i}", Order(100 + i))
    s.worker(engine).drain()
    s.failing[0] = True
    run, _ = s.workflow.submit_once(engine, "order:42", Order(42, note="gift wrap"))
    s.worker(engine).drain()
    assert run.status().state == cyclone.RunState.FAILED

    page.goto(f"{live_url}/")
    assert page.title() == "Overview · cyclone"
    shot(page, "1-overview")
    page.click(f"a.count-failed[href*='workflow={workflow}']")
    expect(page.locator("td.key")).to_have_text(["order:42"])  # waits for the runs page
    shot(page, "2-failed-runs")

    page.click("a.run-link")
    assert page.locator("h1 .state").inner_text() == "failed"
    failed_node = page.locator("svg.dag a.node-failed")
    assert failed_node.locator("title").text_content().startswith("charge: failed, attempt 2/2")
    assert page.locator("svg.dag a.node-completed").count() == 2
    failed_node.click()
    target = page.locator("article.step:target")
    assert target.locator("h3").inner_text().startswith("charge")
    target.locator("details.error summary").first.click()
    assert "raise CardDeclined(message)" in target.locator("pre.traceback").first.inner_text()
    shot(page, "3-failed-step")
    page.goto(f"{live_url}/runs/{run.id}")
    doc_shot(page, "dashboard.png")

    page.click("button.button-retry")
    assert page.locator("p.notice").inner_text().startswith("Retry requested")
    assert run.status().state == cyclone.RunState.RUNNING
    shot(page, "4-retried")

    s.failing[0] = False
    s.worker(engine).drain()
    page.reload()
    assert page.locator("h1 .state").inner_text() == "completed"
    assert page.locator("svg.dag a.node-completed").count() == 4
    assert "shipped charged 42" in page.locator("pre.json").last.inner_text()
    shot(page, "5-completed")


def wait_for_state(page: Any, state: str) -> None:
    """Wait until the page's live script reports ``state`` (after a reset: a new tick).

    Playwright's own assertions, not ``wait_for_function``: the dashboard's CSP forbids
    the eval that one needs, as it forbids any script but its own file.
    """
    page.evaluate("document.documentElement.removeAttribute('data-live-state')")
    expect(page.locator("html")).to_have_attribute("data-live-state", state, timeout=15_000)


def test_an_open_run_page_shows_the_runs_new_state_without_a_reload(
    engine: sa.Engine, live_js_url: str, js_page: Any, name: str
) -> None:
    s = shop(f"live-{name[1:7]}")
    s.failing[0] = False
    run, _ = s.workflow.submit_once(engine, "order:7", Order(7))
    js_page.goto(f"{live_js_url}/runs/{run.id}")
    assert js_page.locator("h1 .state").inner_text() == "running"
    js_page.evaluate("window.notReloaded = true")
    wait_for_state(js_page, "updated")  # the script runs and swaps the page in

    s.worker(engine).drain()  # the database changes; the page is not touched
    assert run.status().state == cyclone.RunState.COMPLETED
    expect(js_page.locator("h1 .state")).to_have_text("completed", timeout=15_000)
    assert js_page.locator("svg.dag a.node-completed").count() == 4
    assert js_page.evaluate("window.notReloaded") is True  # swapped in, not reloaded
    assert js_page.locator("#live-status").inner_text().startswith("live: ")
    shot(js_page, "6-live-completed")


def test_a_live_page_holds_off_while_a_form_has_the_focus_or_the_tab_is_hidden(
    engine: sa.Engine, live_js_url: str, js_page: Any, name: str
) -> None:
    workflow = f"hold-{name[1:7]}"
    s = shop(workflow)
    s.workflow.submit_once(engine, "order:1", Order(1))
    js_page.goto(f"{live_js_url}/runs?workflow={workflow}")
    keys = js_page.locator("td.key")
    assert keys.all_inner_texts() == ["order:1"]

    js_page.fill("input[name=key]", "order:")  # typing a filter, not sent yet
    s.workflow.submit_once(engine, "order:2", Order(2))
    wait_for_state(js_page, "paused-form")
    assert keys.all_inner_texts() == ["order:1"]
    js_page.evaluate("document.activeElement.blur()")
    expect(keys).to_have_count(2, timeout=15_000)
    assert keys.all_inner_texts() == ["order:2", "order:1"]
    assert js_page.input_value("input[name=key]") == "order:"  # the filter form was kept

    js_page.evaluate("Object.defineProperty(document, 'hidden', {value: true, configurable: true})")
    s.workflow.submit_once(engine, "order:3", Order(3))
    wait_for_state(js_page, "paused-hidden")
    assert keys.count() == 2
    js_page.evaluate(
        "delete document.hidden; document.dispatchEvent(new Event('visibilitychange'))"
    )
    expect(keys).to_have_count(3, timeout=15_000)
