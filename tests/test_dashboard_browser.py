"""The dashboard in a real headless browser: Debian's chromium driven by Playwright.

From the overview an operator follows a failed run to its DAG, reads the error, presses
retry, and after a worker drains sees the run completed. Screenshots of each stage are
saved under ``tests/.artifacts/``; with ``CYCLONE_UPDATE_SCREENSHOT=1`` the run page
also replaces ``docs/dashboard.png``, the README's picture.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import sync_playwright
from werkzeug.serving import make_server

import cyclone
from cyclone.dashboard import create_app
from tests.support.dashboard import Order, shop

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / ".artifacts"


@pytest.fixture
def live_url(engine: sa.Engine) -> Iterator[str]:
    """The dashboard served over HTTP on a free port, actions allowed."""
    server = make_server(
        "127.0.0.1", 0, create_app(engine, authorize=lambda e: True), threaded=True
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture
def page(live_url: str) -> Iterator[Any]:
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: apt-get install chromium"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        context = browser.new_context(
            viewport={"width": 1280, "height": 900}, java_script_enabled=False
        )
        yield context.new_page()
        context.close()
        browser.close()


def shot(page: Any, name: str) -> Path:
    path = ARTIFACTS / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


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
    assert page.locator("td.key").all_inner_texts() == ["order:42"]
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
    top = ARTIFACTS / "dashboard-run.png"
    page.screenshot(path=str(top))
    if os.environ.get("CYCLONE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(top, ROOT / "docs" / "dashboard.png")

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
