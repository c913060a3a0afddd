"""Dashboard: bulk retry and cancel of the filtered runs (a page that says how many, then a
CSRF-protected form), the queues page with pause and resume, and retrying a standalone job."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from werkzeug.test import Client

import cyclone
from cyclone.dashboard import create_app
from tests.support.dashboard import Order, csrf_token, shop, text_of


def allow(environ: Any) -> bool:
    return True


@pytest.fixture
def admin(engine: sa.Engine) -> Client:
    return Client(create_app(engine, authorize=allow))


def confirm(client: Client, url: str) -> tuple[str, dict[str, str]]:
    """Open a bulk action's confirmation page: its text and the fields of its form."""
    page = client.get(url)
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', html))
    return text_of(html).replace(" ,", ",").replace(" :", ":"), fields


def test_the_runs_list_offers_bulk_actions_for_its_filters(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    html = admin.get(f"/runs?workflow={name}").get_data(as_text=True)
    assert f'href="/runs/retry-all?workflow={name}"' in html
    assert f'href="/runs/cancel-all?workflow={name}"' in html
    failed_only = admin.get(f"/runs?workflow={name}&state=failed").get_data(as_text=True)
    assert "/runs/retry-all?workflow=" in failed_only
    assert "/runs/cancel-all" not in failed_only
    prefix = admin.get("/runs?key=order*").get_data(as_text=True)
    assert "-all?" not in prefix  # a key prefix is not a filter of list_runs
    read_only = Client(create_app(engine)).get(f"/runs?workflow={name}").get_data(as_text=True)
    assert "-all?" not in read_only


def test_retry_all_says_how_many_then_retries_every_failed_run_the_filters_list(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    s = shop(name)
    runs = [s.workflow.submit_once(engine, f"k{i}", Order(i))[0] for i in range(3)]
    s.worker(engine).drain()
    assert {r.status().state for r in runs} == {cyclone.RunState.FAILED}

    text, fields = confirm(admin, f"/runs/retry-all?workflow={name}&state=failed")
    assert f"Retry 3 runs? This retries every failed or cancelled run with workflow {name}" in text
    assert "Retry all 3" in text
    assert (fields["workflow"], fields["state"], fields["key"]) == (name, "failed", "")

    answer = admin.post("/runs/retry-all", data=fields)
    assert answer.status_code == 303
    assert answer.headers["Location"] == (
        f"/runs?workflow={name}&state=failed&done=retry-all&changed=3"
    )
    assert "Retried 3 runs." in text_of(
        admin.get(answer.headers["Location"]).get_data(as_text=True)
    )
    assert {r.status().state for r in runs} == {cyclone.RunState.RUNNING}
    s.failing[0] = False
    s.worker(engine).drain()
    assert {r.status().state for r in runs} == {cyclone.RunState.COMPLETED}


def test_cancel_all_cancels_the_running_runs_the_filters_list_and_no_other(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    s = shop(name)
    runs = [s.workflow.submit_once(engine, f"k{i}", Order(i))[0] for i in range(4)]
    text, fields = confirm(admin, f"/runs/cancel-all?workflow={name}&key=k2")
    assert f"Cancel 1 run? This cancels every running run with workflow {name}, key k2" in text
    assert admin.post("/runs/cancel-all", data=fields).status_code == 303
    assert [r.status().state.value for r in runs] == ["running", "running", "cancelled", "running"]

    text, fields = confirm(admin, f"/runs/cancel-all?workflow={name}")
    assert "Cancel 3 runs?" in text
    assert admin.post("/runs/cancel-all", data=fields).status_code == 303
    assert {r.status().state for r in runs} == {cyclone.RunState.CANCELLED}
    text, _ = confirm(admin, f"/runs/cancel-all?workflow={name}")
    assert "Cancel 0 runs? No running run matches" in text
    assert "Cancel all" not in text


def test_bulk_posts_need_the_csrf_token_and_an_authorised_user(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    _, fields = confirm(admin, f"/runs/cancel-all?workflow={name}")
    assert admin.post("/runs/cancel-all", data={**fields, "csrf_token": "x"}).status_code == 403
    read_only = Client(create_app(engine))
    assert read_only.post("/runs/cancel-all", data=fields).status_code == 403
    assert admin.post("/runs/cancel-all?workflow=x", data={}).status_code == 403
    assert run.status().state == cyclone.RunState.RUNNING
    assert admin.get("/runs/cancel-all?key=k*").status_code == 400
    run.cancel()


def test_a_failed_standalone_job_has_a_retry_button_that_runs_it_again(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    failing = threading.Event()
    failing.set()

    @cyclone.step(name, max_attempts=1)
    def flaky(ctx: cyclone.StepContext, args: Any) -> str:
        if failing.is_set():
            raise RuntimeError("down")
        return "ok"

    job = flaky.enqueue(engine, 1)
    cyclone.Worker(engine, steps=[flaky]).drain()
    html = admin.get(f"/jobs/{job.id}").get_data(as_text=True)
    assert f'action="/jobs/{job.id}/retry"' in html
    assert f'action="/jobs/{job.id}/cancel"' not in html
    answer = admin.post(f"/jobs/{job.id}/retry", data={"csrf_token": csrf_token(html)})
    assert answer.status_code == 303
    assert answer.headers["Location"] == f"/jobs/{job.id}?done=job-retry"
    page = admin.get(answer.headers["Location"]).get_data(as_text=True)
    assert "runs again from its first attempt" in page
    assert f'action="/jobs/{job.id}/retry"' not in page
    again = admin.post(f"/jobs/{job.id}/retry", data={"csrf_token": csrf_token(page)})
    assert again.status_code == 409
    assert f"cannot retry job {job.id}: it is available" in again.get_data(as_text=True)
    failing.clear()
    cyclone.Worker(engine, steps=[flaky]).drain()
    assert job.result(timeout=5) == "ok"


def test_the_queues_page_pauses_and_resumes_a_queue(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    @cyclone.step(name, queue=f"{name}_q")
    def work(ctx: cyclone.StepContext, args: Any) -> None: ...

    job = work.enqueue(engine, 1)
    html = admin.get("/queues").get_data(as_text=True)
    row = re.search(rf"<tr>\s*<td class=\"key\">{name}_q</td>.*?</tr>", html, re.S)
    assert row is not None
    assert "active" in row.group(0)
    assert 'name="queue" value="' + name + '_q"' in row.group(0)
    answer = admin.post(
        "/queues/pause", data={"csrf_token": csrf_token(html), "queue": f"{name}_q"}
    )
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/queues?done=queue-pause"
    page = admin.get("/queues?done=queue-pause").get_data(as_text=True)
    assert "no worker claims its jobs until it is resumed" in page
    row = re.search(rf"<tr>\s*<td class=\"key\">{name}_q</td>.*?</tr>", page, re.S)
    assert row is not None
    assert "paused" in row.group(0)
    assert 'action="/queues/resume"' in row.group(0)
    assert cyclone.Worker(engine, steps=[work]).drain() == 0

    answer = admin.post(
        "/queues/resume", data={"csrf_token": csrf_token(page), "queue": f"{name}_q"}
    )
    assert answer.status_code == 303
    assert cyclone.Worker(engine, steps=[work]).drain() == 1
    assert job.status().state == cyclone.JobState.COMPLETED
    read_only = Client(create_app(engine)).get("/queues").get_data(as_text=True)
    assert "/queues/pause" not in read_only
    assert admin.post("/queues/pause", data={"csrf_token": csrf_token(page)}).status_code == 400


@pytest.mark.parametrize(
    ("path", "field"), [("/schedules/pause", "schedule"), ("/queues/pause", "queue")]
)
def test_an_action_on_a_name_with_a_nul_is_a_400(admin: Client, path: str, field: str) -> None:
    # The Client refused the name with a ValueError (the schedule's name failed in the
    # driver before): a 500 with its traceback.
    page = admin.get("/queues").get_data(as_text=True)
    answer = admin.post(path, data={"csrf_token": csrf_token(page), field: "a\x00"})
    assert answer.status_code == 400
    assert f"&#39;{field}&#39; holds a NUL character" in answer.get_data(as_text=True)
