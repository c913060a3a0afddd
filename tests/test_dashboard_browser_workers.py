"""The dashboard's Workers page in a real headless browser (Debian's chromium, Playwright).

An operator follows the navigation's *Workers* link to a real worker, serving on a
thread of the test with a job in hand: its row shows its host, pid, running jobs out of
its concurrency, the age of its last heartbeat and the silence after which the leader
removes it, what it serves (linking to its runs), and *running*; asked to stop, it waits
for its job and the page says *stopping*; once it stopped, its row is gone. The database
decides when to look (:func:`tests.conftest.wait_until`), the pages are awaited with
Playwright's ``expect``. A screenshot of the page is saved under ``tests/.artifacts/``.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

import cyclone
from cyclone.dashboard import create_app
from tests.conftest import wait_until
from tests.support.browser import chromium, serve, shot
from tests.support.workers import Background

COLUMNS = [
    "worker",
    "host",
    "pid",
    "started",
    "last heartbeat",
    "running",
    "queues",
    "workflows",
    "step kinds",
    "version",
    "state",
]


@pytest.fixture
def live_url(engine: sa.Engine) -> Iterator[str]:
    """The dashboard over HTTP, read-only, pages not refreshing themselves (the browser
    runs without JavaScript: a reload shows what changed)."""
    with serve(create_app(engine)) as url:
        yield url


@pytest.fixture
def page(live_url: str) -> Iterator[Any]:
    with chromium(javascript=False) as found:
        yield found


def listed(engine: sa.Engine, worker_id: str) -> cyclone.WorkerStatus | None:
    return next((w for w in cyclone.Client(engine).list_workers() if w.id == worker_id), None)


def heartbeat_age(cell: str) -> timedelta:
    """The age the heartbeat cell shows: ``(850 ms ago; ...`` or ``(1.2 s ago; ...``."""
    found = re.search(r"\((\d+(?:\.\d)?) (ms|s) ago", cell)
    assert found, cell
    value = float(found[1])
    return timedelta(milliseconds=value) if found[2] == "ms" else timedelta(seconds=value)


def test_the_workers_page_shows_a_running_worker_then_stopping_then_gone(
    engine: sa.Engine, live_url: str, page: Any, name: str
) -> None:
    workflow = f"mail-{name[1:7]}"
    wf: cyclone.Workflow[Any] = cyclone.Workflow(workflow)
    release = threading.Event()

    @wf.step()
    def send(ctx: cyclone.StepContext, value: Any) -> Any:
        assert release.wait(60)
        return value

    kind = cyclone.step(f"{workflow}.ping")(lambda ctx, value: value)
    run = wf.submit(engine, 1)
    worker = cyclone.Worker(
        engine,
        workflows=[wf],
        steps=[kind],
        concurrency=3,
        heartbeat_interval=timedelta(milliseconds=200),
        rescue_after=timedelta(seconds=5),
        poll_interval=0.1,
        sweep=False,
    )
    background = Background(worker.run, name="test-browser-worker")
    try:
        wait_until(lambda: (w := listed(engine, worker.id)) and w.running == 1, timeout=30)

        page.goto(f"{live_url}/")
        page.click("header nav a:text-is('Workers')")
        expect(page).to_have_url(f"{live_url}/workers")
        expect(page.locator("h1")).to_have_text("Workers")
        expect(page.locator("table.workers thead th")).to_have_text(COLUMNS)
        row = page.locator(
            "table.workers tbody tr", has=page.locator(f"td.key:text-is('{worker.id}')")
        )
        expect(row).to_have_count(1)
        cells = row.locator("td")
        expect(cells.nth(1)).to_have_text(socket.gethostname())
        expect(cells.nth(2)).to_have_text(str(os.getpid()))
        expect(cells.nth(4)).to_have_text(
            re.compile(
                r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC "
                r"\((\d+ ms|\d+\.\d s) ago; removed after 5\.0 s silent\)$"
            )
        )
        expect(cells.nth(5)).to_have_text("1 / 3")
        expect(cells.nth(6)).to_have_text("all")
        expect(cells.nth(8).locator("a")).to_have_text(f"{workflow}.ping")
        expect(cells.nth(8).locator("a")).to_have_attribute("href", f"/jobs?kind={workflow}.ping")
        expect(cells.nth(9)).to_have_text(cyclone.__version__)
        expect(cells.nth(10)).to_have_text("running")
        shot(page, "workers-running")

        # The heartbeat's age, read when the page was made, is well below the 5 s the
        # leader waits: the worker beats every 0.2 s.
        assert heartbeat_age(cells.nth(4).inner_text()) < timedelta(seconds=5)

        worker.stop()
        stopping = wait_until(
            lambda: (w := listed(engine, worker.id)) and w.stopping_at is not None and w,
            timeout=30,
        )
        assert stopping.running == 1  # it waits for its job
        page.reload()
        expect(cells.nth(10)).to_have_text(re.compile(r"^stopping since \d{4}-\d\d-\d\d .* UTC$"))
        expect(cells.nth(10).locator(".state-stopping")).to_have_text("stopping")
        expect(cells.nth(5)).to_have_text("1 / 3")
        shot(page, "workers-stopping")

        # Its workflow links to its runs, where the run in hand is listed.
        cells.nth(7).locator("a", has_text=workflow).click()
        expect(page).to_have_url(re.compile(rf"/runs\?workflow={re.escape(workflow)}$"))
        expect(page.locator("select[name=workflow]")).to_have_value(workflow)
        expect(page.locator(f"a.run-link[href$='/runs/{run.id}']")).to_have_count(1)
    finally:
        release.set()
        background.join(30)
        worker.close()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert listed(engine, worker.id) is None

    page.click("header nav a:text-is('Workers')")
    expect(page).to_have_url(f"{live_url}/workers")
    expect(page.locator(f"td.key:text-is('{worker.id}')")).to_have_count(0)
