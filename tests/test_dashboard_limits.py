"""Dashboard limits page: per limit and key, running, waiting and max, read through the Client."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from markupsafe import escape
from werkzeug.test import Client

import cyclone
from cyclone.dashboard import create_app


def test_the_limits_page_shows_running_waiting_and_max_per_key_and_is_in_the_navigation(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        name, concurrency=cyclone.Concurrency(3, key=lambda v: v["k"])
    )

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None: ...

    wf.submit(engine, {"k": "<tenant>"})
    wf.submit(engine, {"k": "<tenant>"})
    client = Client(create_app(engine))
    assert 'href="/limits"' in client.get("/").get_data(as_text=True)
    answer = client.get("/limits")
    assert answer.status_code == 200
    page = answer.get_data(as_text=True)
    start = page.index(f"workflow:{name}")
    row = page[start : page.index("</tr>", start)]
    assert str(escape("<tenant>")) in row  # escaped
    assert "<tenant>" not in row
    cells = [c.split(">", 1)[1].split("<", 1)[0] for c in row.split("<td")[1:]]
    assert cells == ["3", "runs", "queue", "&lt;tenant&gt;", "0", "2"]
