"""Dashboard actions: retry, retry all and cancel as POST forms, CSRF, authorisation, escaping."""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa
from werkzeug.test import Client

import cyclone
from cyclone.dashboard import create_app
from tests.support.dashboard import Order, Shop, csrf_token, shop


def allow(environ: Any) -> bool:
    return True


def failed(engine: sa.Engine, name: str, key: str = "k") -> tuple[Shop, cyclone.ResultRun[str]]:
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, key, Order(1))
    s.worker(engine).drain()
    assert run.status().state == cyclone.RunState.FAILED
    return s, run


@pytest.fixture
def admin(engine: sa.Engine) -> Client:
    return Client(create_app(engine, authorize=allow))


def post_action(client: Client, page: str, action: str) -> Any:
    html = client.get(page).get_data(as_text=True)
    assert f'action="{page}/{action}"' in html
    return client.post(f"{page}/{action}", data={"csrf_token": csrf_token(html)})


def test_retry_reruns_the_failed_steps_and_the_run_completes(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    s, run = failed(engine, name)
    answer = post_action(admin, f"/runs/{run.id}", "retry")
    assert answer.status_code == 303
    assert answer.headers["Location"] == f"/runs/{run.id}?done=retry"
    assert run.status().state == cyclone.RunState.RUNNING
    assert "Retry requested" in admin.get(answer.headers["Location"]).get_data(as_text=True)
    s.failing[0] = False
    s.worker(engine).drain()
    assert run.result(timeout=5) == "shipped charged 1"


def test_retry_all_reruns_every_step(engine: sa.Engine, admin: Client, name: str) -> None:
    s, run = failed(engine, name)
    s.failing[0] = False
    answer = post_action(admin, f"/runs/{run.id}", "retry-all")
    assert answer.status_code == 303
    with engine.connect() as c:
        states = c.execute(
            sa.text("SELECT kind, state FROM cyclone_jobs WHERE run_id = :r ORDER BY kind"),
            {"r": run.id},
        ).all()
    assert [tuple(row) for row in states] == [
        ("charge", "blocked"),
        ("fetch", "available"),
        ("notify", "blocked"),
        ("ship", "blocked"),
    ]
    assert s.worker(engine).drain() == 4
    assert run.status().state == cyclone.RunState.COMPLETED


def test_cancel_stops_a_running_run(engine: sa.Engine, admin: Client, name: str) -> None:
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    html = admin.get(f"/runs/{run.id}").get_data(as_text=True)
    assert "Retry failed steps" not in html  # only the actions the state allows are shown
    answer = post_action(admin, f"/runs/{run.id}", "cancel")
    assert answer.status_code == 303
    assert run.status().state == cyclone.RunState.CANCELLED
    assert s.worker(engine).drain() == 0


def test_an_action_the_state_refuses_is_409_with_the_reason(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    s = shop(name)
    s.failing[0] = False
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    s.worker(engine).drain()
    html = admin.get(f"/runs/{run.id}").get_data(as_text=True)
    answer = admin.post(f"/runs/{run.id}/retry", data={"csrf_token": csrf_token(html)})
    assert answer.status_code == 409
    assert f"cannot retry run {run.id}: it is completed" in answer.get_data(as_text=True)
    assert run.status().state == cyclone.RunState.COMPLETED


def test_cancel_job_action_cancels_a_waiting_standalone_job(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    @cyclone.step(name)
    def noop(ctx: cyclone.StepContext, args: int) -> None:
        return None

    job = noop.enqueue(engine, 1)
    answer = post_action(admin, f"/jobs/{job.id}", "cancel")
    assert answer.status_code == 303
    assert job.status().state == cyclone.JobState.CANCELLED
    page = admin.get(answer.headers["Location"]).get_data(as_text=True)
    assert "Cancelled." in page
    assert "Cancel job" not in page
    token = csrf_token(admin.get(f"/jobs/{noop.enqueue(engine, 2).id}").get_data(as_text=True))
    again = admin.post(f"/jobs/{job.id}/cancel", data={"csrf_token": token})
    assert again.status_code == 409
    assert f"cannot cancel job {job.id}: it is cancelled" in again.get_data(as_text=True)


def test_the_job_page_of_a_step_links_its_run_and_offers_no_job_action(
    engine: sa.Engine, admin: Client, name: str
) -> None:
    """A step's job id (from a worker's log) opens its job page, which links the run (it
    was a 404, "no standalone job"); a step is retried and cancelled with its run."""
    _, run = failed(engine, name)
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    step = next(s for s in detail.steps if s.state == cyclone.JobState.FAILED)
    answer = admin.get(f"/jobs/{step.job_id}")
    assert answer.status_code == 200
    html = answer.get_data(as_text=True)
    assert f'<a href="/runs/{run.id}">' in html
    assert f"workflow {name}, step {step.name}" in html
    assert "Retry job" not in html
    assert "Cancel job" not in html


def test_read_only_by_default_no_buttons_and_every_post_is_403(
    engine: sa.Engine, name: str
) -> None:
    _, run = failed(engine, name)
    client = Client(create_app(engine))
    html = client.get(f"/runs/{run.id}").get_data(as_text=True)
    assert '<form method="post"' not in html
    assert "read-only" in html
    for action in ("retry", "retry-all", "cancel"):
        answer = client.post(f"/runs/{run.id}/{action}", data={"csrf_token": "anything"})
        assert answer.status_code == 403
        assert "read-only" in answer.get_data(as_text=True)
    assert run.status().state == cyclone.RunState.FAILED


def test_authorize_is_asked_per_request_with_the_environ(engine: sa.Engine, name: str) -> None:
    _, run = failed(engine, name)
    client = Client(create_app(engine, authorize=lambda env: env.get("REMOTE_USER") == "ops"))
    as_ops = {"REMOTE_USER": "ops"}
    html = client.get(f"/runs/{run.id}", environ_overrides=as_ops).get_data(as_text=True)
    token = csrf_token(html)
    other = client.get(f"/runs/{run.id}", environ_overrides={"REMOTE_USER": "guest"})
    assert '<form method="post"' not in other.get_data(as_text=True)
    refused = client.post(
        f"/runs/{run.id}/retry", data={"csrf_token": token}, environ_overrides={"REMOTE_USER": "x"}
    )
    assert refused.status_code == 403
    accepted = client.post(
        f"/runs/{run.id}/retry", data={"csrf_token": token}, environ_overrides=as_ops
    )
    assert accepted.status_code == 303


@pytest.mark.parametrize("token", [None, "", "0" * 64, "forged"])
def test_a_post_without_the_right_csrf_token_is_403_and_changes_nothing(
    engine: sa.Engine, admin: Client, name: str, token: str | None
) -> None:
    _, run = failed(engine, name)
    admin.get(f"/runs/{run.id}")  # the browser has its cookie
    data = {} if token is None else {"csrf_token": token}
    answer = admin.post(f"/runs/{run.id}/retry", data=data)
    assert answer.status_code == 403
    assert "CSRF token is missing or wrong" in answer.get_data(as_text=True)
    assert run.status().state == cyclone.RunState.FAILED


def test_a_token_from_another_browser_is_refused(engine: sa.Engine, name: str) -> None:
    _, run = failed(engine, name)
    app = create_app(engine, authorize=allow)
    victim, attacker = Client(app), Client(app)
    token = csrf_token(attacker.get(f"/runs/{run.id}").get_data(as_text=True))
    victim.get("/")
    assert victim.post(f"/runs/{run.id}/retry", data={"csrf_token": token}).status_code == 403
    no_cookie = Client(app, use_cookies=False)
    assert no_cookie.post(f"/runs/{run.id}/retry", data={"csrf_token": token}).status_code == 403
    assert run.status().state == cyclone.RunState.FAILED


def test_tokens_signed_with_a_shared_secret_work_across_app_instances(
    engine: sa.Engine, name: str
) -> None:
    _, run = failed(engine, name)
    one = create_app(engine, authorize=allow, secret="s3cret")
    two = create_app(engine, authorize=allow, secret="s3cret")
    browser = Client(one)
    token = csrf_token(browser.get(f"/runs/{run.id}").get_data(as_text=True))
    cookie = browser.get_cookie("cyclone_csrf")
    assert cookie is not None
    other = Client(two)
    other.set_cookie("cyclone_csrf", cookie.value)
    assert other.post(f"/runs/{run.id}/retry", data={"csrf_token": token}).status_code == 303


def test_script_in_names_keys_inputs_and_errors_renders_as_text(
    engine: sa.Engine, name: str
) -> None:
    evil = "<script>alert(1)</script>"
    s = shop(f"{name}{evil}", message=f"declined {evil}")
    run, _ = s.workflow.submit_once(engine, f"key{evil}", Order(1, note=evil))
    s.worker(engine).drain()

    @cyclone.step(f"{name}{evil}", queue=f"{name}{evil}")
    def mail(ctx: cyclone.StepContext, args: str) -> None:
        raise ValueError(evil)

    job = mail.enqueue(engine, evil, unique=evil)
    cyclone.Worker(engine, steps=[mail]).drain()

    client = Client(create_app(engine, authorize=allow, title=evil))
    pages = [
        "/",
        f"/runs?workflow={name}%3Cscript%3Ealert(1)%3C/script%3E",
        "/runs?key=key*",
        f"/runs/{run.id}",
        "/jobs",
        f"/jobs/{job.id}",
        f"/runs?state={evil}",
    ]
    for page in pages:
        html = client.get(page).get_data(as_text=True)
        # The one script tag is the dashboard's own file; everything else is text.
        assert html.lower().count("<script") == 1, page
        assert '<script src="/static/live.js" defer></script>' in html, page
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, page
    run_page = client.get(f"/runs/{run.id}").get_data(as_text=True)
    assert "declined &lt;script&gt;" in run_page
    assert re.search(r"&#34;note&#34;: &#34;&lt;script&gt;", run_page)
