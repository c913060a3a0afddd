"""The dashboard's operations in a real headless browser, clicked as an operator clicks them.

From the overview's *waiting* count to the parked runs and one run's page; a bulk cancel
from the filtered runs list through the page that says how many; the queues page pausing a
queue by name and resuming it; a failed standalone job's Retry button. A real worker and
the database decide each outcome: pages are awaited with Playwright's ``expect``, the
database with :func:`tests.conftest.wait_until`. With ``CYCLONE_UPDATE_SCREENSHOT=1`` the
parked run page, the bulk confirmation page and the queues page replace
``docs/dashboard-parked.png``, ``docs/dashboard-bulk.png`` and ``docs/dashboard-queues.png``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa
from playwright.sync_api import expect

import cyclone
from cyclone.dashboard import create_app
from tests.conftest import wait_until
from tests.support.browser import chromium, doc_shot, serve, shot
from tests.support.dashboard import Order, shop


@pytest.fixture
def live_url(engine: sa.Engine) -> Iterator[str]:
    """The dashboard over HTTP, actions allowed, pages not refreshing themselves (the
    browser runs without JavaScript: every page and form works so)."""
    with serve(create_app(engine, authorize=lambda e: True)) as url:
        yield url


@pytest.fixture
def page(live_url: str) -> Iterator[Any]:
    with chromium(javascript=False) as found:
        yield found


class Payment(msgspec.Struct):
    amount: int


def payment(workflow: str) -> cyclone.Workflow[Order]:
    """``reserve -> paid (waits for the signal 'paid') -> ship``."""
    wf: cyclone.Workflow[Order] = cyclone.Workflow(workflow, input=Order)

    @wf.step()
    def reserve(ctx: cyclone.StepContext, order: Order) -> int:
        return order.order_id

    @wf.wait("paid", after=[reserve])
    def paid(ctx: cyclone.StepContext, payment: Payment) -> int:
        return payment.amount

    @wf.step(after=[paid])
    def ship(ctx: cyclone.StepContext, order: Order) -> str:
        return f"shipped {order.order_id} for {ctx.output(paid)}"

    return wf


def test_the_overviews_waiting_count_leads_to_the_runs_waiting_and_their_run_page(
    engine: sa.Engine, live_url: str, page: Any, name: str
) -> None:
    workflow = f"payment-{name[1:7]}"
    wf = payment(workflow)
    worker = cyclone.Worker(engine, workflows=[wf])
    waiting = [wf.submit_once(engine, f"order:{i}", Order(i))[0] for i in (1, 2)]
    worker.drain()
    busy, _ = wf.submit_once(engine, "order:3", Order(3))  # due, not parked: no worker ran it
    wait_until(lambda: all(r.status().parked == cyclone.Parked.WAITING for r in waiting))

    page.goto(f"{live_url}/")
    count = page.locator(f"a.count-waiting[href*='workflow={workflow}&']")
    expect(count).to_have_text("2")
    running = page.locator(f"a.count-running[href*='workflow={workflow}&']")
    expect(running).to_have_text("1")  # the run with a step due is counted apart
    count.click()

    expect(page).to_have_url(re.compile(r"/runs\?.*parked=waiting"))
    expect(page.locator("select[name=parked]")).to_have_value("waiting")
    expect(page.locator("td.key")).to_have_text(["order:2", "order:1"])
    labels = page.locator("table.runs span.parked-waiting")
    expect(labels).to_have_text(["waiting", "waiting"])
    expect(page.locator("table.runs")).not_to_contain_text("order:3")
    shot(page, "7-runs-waiting")

    page.locator("a.run-link").first.click()
    expect(page).to_have_url(re.compile(rf"/runs/{waiting[1].id}$"))
    expect(page.locator("h1 .state")).to_have_text("running")
    expect(page.locator("h1 .parked")).to_have_text("waiting")
    expect(page.locator("dd.run-parked")).to_have_text("waiting for 'paid'")
    expect(page.locator("svg.dag a.node-completed")).to_have_count(1)
    expect(page.locator("svg.dag a.parked")).to_have_count(1)
    expect(page).not_to_have_title(re.compile("so far"))
    expect(page.locator("body")).not_to_contain_text("so far")
    doc_shot(page, "dashboard-parked.png")

    wf.signal(engine, "order:2", "paid", Payment(30))
    worker.drain()
    wait_until(lambda: waiting[1].status().state == cyclone.RunState.COMPLETED)
    page.reload()
    expect(page.locator("h1 .state")).to_have_text("completed")
    expect(page.locator("h1 .parked")).to_have_count(0)
    for run in (waiting[0], busy):
        run.cancel()


def test_a_bulk_cancel_from_the_filtered_runs_says_how_many_then_cancels_them(
    engine: sa.Engine, live_url: str, page: Any, name: str
) -> None:
    workflow = f"checkout-{name[1:7]}"
    s = shop(workflow)
    runs = [s.workflow.submit_once(engine, f"order:{i}", Order(i))[0] for i in range(1, 4)]
    other = shop(f"refund-{name[1:7]}")
    bystander, _ = other.workflow.submit_once(engine, "order:1", Order(1))

    page.goto(f"{live_url}/runs")
    page.select_option("select[name=workflow]", workflow)
    page.select_option("select[name=state]", "running")
    page.click("form.filters button[type=submit]")
    expect(page.locator("td.key")).to_have_text(["order:3", "order:2", "order:1"])
    expect(page.locator("p.bulk a.button-retry")).to_have_count(0)  # none failed here
    page.click("p.bulk a.button-cancel")

    expect(page.locator("h1")).to_have_text("Cancel 3 runs?")
    expect(page.locator("main")).to_contain_text(
        f"This cancels every running run with workflow {workflow}, state running: 3 now"
    )
    confirm = page.locator("form.action button.button-cancel")
    expect(confirm).to_have_text("Cancel all 3")
    doc_shot(page, "dashboard-bulk.png")
    assert {r.status().state for r in runs} == {cyclone.RunState.RUNNING}  # nothing yet
    confirm.click()

    expect(page.locator("p.notice")).to_have_text("Cancelled 3 runs.")
    expect(page.locator("select[name=workflow]")).to_have_value(workflow)
    expect(page.locator("td.key")).to_have_count(0)  # no running run of it is left
    wait_until(lambda: {r.status().state for r in runs} == {cyclone.RunState.CANCELLED})
    assert s.worker(engine).drain() == 0  # their steps never start
    assert bystander.status().state == cyclone.RunState.RUNNING  # another workflow's run
    shot(page, "8-bulk-cancelled")
    bystander.cancel()


def test_the_queues_page_pauses_a_queue_by_name_and_resumes_it(
    engine: sa.Engine, live_url: str, page: Any, name: str, serving: Any
) -> None:
    queue = f"mail-{name[1:7]}"

    @cyclone.step(f"send_receipt_{name}", queue=queue)
    def send_receipt(ctx: cyclone.StepContext, order_id: int) -> str:
        return f"receipt {order_id} sent"

    client = cyclone.Client(engine)
    page.goto(f"{live_url}/queues")
    page.fill("input[name=queue][type=text]", queue)
    page.click("form.action:has(input[type=text]) button.button-pause")
    expect(page.locator("p.notice")).to_contain_text("no worker claims its jobs")
    row = page.locator("table.queues tr", has=page.locator(f"td.key:text-is('{queue}')"))
    expect(row.locator(".state")).to_have_text("paused")
    wait_until(lambda: any(q.name == queue and q.paused for q in client.list_queues()))

    jobs = [send_receipt.enqueue(engine, i) for i in range(1, 3)]
    assert cyclone.Worker(engine, steps=[send_receipt]).drain() == 0  # paused: none claimed
    page.reload()
    expect(row.locator("td.num").first).to_have_text("2")  # available, waiting for resume
    expect(row.locator("button")).to_have_text("Resume")
    doc_shot(page, "dashboard-queues.png")

    row.locator("button.button-resume").click()
    expect(page.locator("p.notice")).to_contain_text("workers claim its jobs again")
    expect(row.locator(".state")).to_have_text("active")
    serving(cyclone.Worker(engine, steps=[send_receipt]))
    wait_until(
        lambda: all(j.status().state == cyclone.JobState.COMPLETED for j in jobs), timeout=30
    )
    page.reload()
    expect(row.locator("td.num")).to_have_text(["0", "0", "0"])
    shot(page, "9-queue-resumed")


def test_a_failed_standalone_jobs_retry_button_runs_it_again(
    engine: sa.Engine, live_url: str, page: Any, name: str
) -> None:
    failing = threading.Event()
    failing.set()
    kind = f"refund_{name}"

    @cyclone.step(kind, max_attempts=1)
    def refund(ctx: cyclone.StepContext, order_id: int) -> str:
        if failing.is_set():
            raise RuntimeError("the payment provider is down")
        return f"refunded {order_id}"

    job = refund.enqueue(engine, 42)
    cyclone.Worker(engine, steps=[refund]).drain()
    assert job.status().state == cyclone.JobState.FAILED

    page.goto(f"{live_url}/jobs?kind={kind}&state=failed")
    page.click(f"a[href$='/jobs/{job.id}']")
    expect(page.locator("h1 .state")).to_have_text("failed")
    expect(page.locator("details.error summary")).to_contain_text("the payment provider is down")
    page.click("button.button-retry")

    expect(page.locator("p.notice")).to_contain_text("runs again from its first attempt")
    expect(page.locator("h1 .state")).to_have_text("available")
    expect(page.locator("button.button-retry")).to_have_count(0)
    wait_until(lambda: job.status().state == cyclone.JobState.AVAILABLE)
    failing.clear()
    assert cyclone.Worker(engine, steps=[refund]).drain() == 1
    wait_until(lambda: job.status().state == cyclone.JobState.COMPLETED)
    page.reload()
    expect(page.locator("h1 .state")).to_have_text("completed")
    expect(page.locator("pre.json").last).to_have_text('"refunded 42"')
    shot(page, "10-job-retried")
