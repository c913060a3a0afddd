"""Dashboard schedules: the list, pause and resume as POST forms, authorisation, escaping."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from markupsafe import escape
from werkzeug.test import Client

import cyclone
from cyclone import schedules as sched
from cyclone.dashboard import create_app
from cyclone.schema import schedules
from tests.support.dashboard import csrf_token


def allow(environ: Any) -> bool:
    return True


@pytest.fixture
def cleanup(engine: sa.Engine) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    with engine.begin() as conn:
        conn.execute(schedules.delete().where(schedules.c.name.in_(names)))


def hourly(engine: sa.Engine, name: str, cleanup: list[str]) -> cyclone.Schedule:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(f"wf-{name}")

    @wf.step()
    def noop(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    schedule = wf.schedule(name, every=timedelta(hours=1), input={"n": 1})
    cleanup.append(name)
    sched.register(engine, [schedule])
    return schedule


def status(engine: sa.Engine, name: str) -> cyclone.ScheduleStatus:
    (found,) = [s for s in cyclone.Client(engine).list_schedules() if s.name == name]
    return found


def row_of(page: str, name: str) -> str:
    start = page.index(str(escape(name)))
    return page[start : page.index("</tr>", start)]


def test_the_page_lists_a_registered_schedule_and_is_in_the_navigation(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    hourly(engine, name, cleanup)
    client = Client(create_app(engine))
    assert 'href="/schedules"' in client.get("/").get_data(as_text=True)
    answer = client.get("/schedules")
    assert answer.status_code == 200
    row = row_of(answer.get_data(as_text=True), name)
    assert f"wf-{name}" in row
    assert "every 1:00:00" in row
    assert "UTC" in row
    assert "active" in row


def test_pause_then_resume_changes_the_state_shown_and_listed(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    hourly(engine, name, cleanup)
    admin = Client(create_app(engine, authorize=allow))
    page = admin.get("/schedules").get_data(as_text=True)
    assert 'action="/schedules/pause"' in page
    answer = admin.post("/schedules/pause", data={"csrf_token": csrf_token(page), "schedule": name})
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/schedules?done=pause"
    assert status(engine, name).paused
    page = admin.get(answer.headers["Location"]).get_data(as_text=True)
    assert "Paused:" in page
    row = row_of(page, name)
    assert "paused" in row
    assert "Resume" in row
    answer = admin.post(
        "/schedules/resume", data={"csrf_token": csrf_token(page), "schedule": name}
    )
    assert answer.status_code == 303
    assert not status(engine, name).paused
    row = row_of(admin.get("/schedules").get_data(as_text=True), name)
    assert "active" in row
    assert "Pause" in row


def test_an_unknown_schedule_is_404_with_the_reason(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    hourly(engine, name, cleanup)
    admin = Client(create_app(engine, authorize=allow))
    token = csrf_token(admin.get("/schedules").get_data(as_text=True))
    answer = admin.post("/schedules/pause", data={"csrf_token": token, "schedule": f"{name}x"})
    assert answer.status_code == 404
    assert f"{name}x" in answer.get_data(as_text=True)
    assert not status(engine, name).paused


def test_read_only_has_no_buttons_and_every_post_is_403(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    hourly(engine, name, cleanup)
    client = Client(create_app(engine))
    page = client.get("/schedules").get_data(as_text=True)
    assert '<form method="post"' not in page
    for action in ("pause", "resume"):
        answer = client.post(f"/schedules/{action}", data={"csrf_token": "x", "schedule": name})
        assert answer.status_code == 403
    assert not status(engine, name).paused


def test_a_post_without_the_right_csrf_token_is_403(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    hourly(engine, name, cleanup)
    admin = Client(create_app(engine, authorize=allow))
    admin.get("/schedules")
    answer = admin.post("/schedules/pause", data={"csrf_token": "forged", "schedule": name})
    assert answer.status_code == 403
    assert not status(engine, name).paused


def test_script_in_a_schedule_name_renders_as_text(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    evil = f'{name}<script>alert("x")</script>'
    hourly(engine, evil, cleanup)
    admin = Client(create_app(engine, authorize=allow))
    page = admin.get("/schedules").get_data(as_text=True)
    assert "<script>" not in page
    assert str(escape(evil)) in page
    answer = admin.post("/schedules/pause", data={"csrf_token": csrf_token(page), "schedule": evil})
    assert answer.status_code == 303
    assert status(engine, evil).paused
