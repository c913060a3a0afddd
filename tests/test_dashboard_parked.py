"""The dashboard tells parked runs from running ones: the run page says "waiting for 'paid'",
"sleeping until ..." or "starts at ..." (no growing "took ... so far", no "ready since" a
time ahead), the runs page labels and filters them, the overview counts them apart."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from werkzeug.test import Client

import cyclone
from cyclone.dashboard import create_app
from tests.support.dashboard import text_of
from tests.test_parked import parking


def page_text(client: Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.get_data(as_text=True)
    return html.unescape(text_of(page.get_data(as_text=True)))


def step_card(text: str, name: str) -> str:
    found = re.search(
        rf"{name} (?:blocked|available|running|completed)(.*?)(?:finished)", text, re.S
    )
    assert found is not None, text
    return found.group(1)


def test_the_run_page_says_what_a_parked_run_waits_for(engine: sa.Engine, name: str) -> None:
    flows = parking(name)
    waiting = flows.waits.submit(engine, 1)
    sleeping = flows.sleeps.submit(engine, 2)
    delayed = flows.waits.submit(engine, 3, run_at=datetime(2100, 1, 2, 3, 4, 5, tzinfo=UTC))
    cyclone.Worker(engine, workflows=[flows.waits, flows.sleeps]).drain()
    client = Client(create_app(engine))

    text = page_text(client, f"/runs/{waiting.id}")
    assert "running waiting" in text
    assert "parked waiting for 'paid'" in text
    card = step_card(text, "paid")
    assert "waits waiting for 'paid'" in card
    assert "so far" not in text
    assert "ready since" not in card
    assert "scheduled" not in card

    text = page_text(client, f"/runs/{sleeping.id}")
    detail = cyclone.Client(engine).get_run_detail(sleeping.id)
    assert detail is not None
    wakes = next(s.wakes_at for s in detail.steps if s.name == "remind")
    assert wakes is not None
    until = wakes.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"parked sleeping until {until}" in text
    assert f"waits sleeping until {until}" in step_card(text, "remind")
    assert "so far" not in text

    text = page_text(client, f"/runs/{delayed.id}")
    assert "parked starts at 2100-01-02 03:04:05 UTC" in text
    assert "waits starts at 2100-01-02 03:04:05 UTC" in step_card(text, "reserve")
    for run in (waiting, sleeping, delayed):
        run.cancel()


def test_the_runs_page_labels_parked_runs_and_filters_by_them(engine: sa.Engine, name: str) -> None:
    flows = parking(name)
    waiting = flows.waits.submit(engine, 1)
    delayed = flows.waits.submit(engine, 3, delay=timedelta(days=1))
    cyclone.Worker(engine, workflows=[flows.waits]).drain()
    running = flows.waits.submit(engine, 4)
    client = Client(create_app(engine))

    body = client.get(f"/runs?workflow={flows.waits.name}").get_data(as_text=True)
    rows = {
        m.group(1): text_of(m.group(2))
        for m in re.finditer(r'href="/runs/([0-9a-f-]{36})".*?</td>(.*?)</tr>', body, re.S)
    }
    assert "running waiting" in rows[str(waiting.id)]
    assert "running delayed" in rows[str(delayed.id)]
    assert "waiting" not in rows[str(running.id)]
    assert "delayed" not in rows[str(running.id)]

    body = client.get(f"/runs?workflow={flows.waits.name}&parked=waiting").get_data(as_text=True)
    assert set(re.findall(r'href="/runs/([0-9a-f-]{36})"', body)) == {str(waiting.id)}
    assert '<option value="waiting" selected>' in body
    bad = client.get("/runs?parked=resting")
    assert bad.status_code == 400
    assert "Unknown way of parking 'resting'" in html.unescape(bad.get_data(as_text=True))
    for run in (waiting, delayed, running):
        run.cancel()


def test_the_overview_counts_parked_runs_apart_from_running_ones(
    engine: sa.Engine, name: str
) -> None:
    flows = parking(name)
    flows.waits.submit(engine, 1)
    flows.waits.submit(engine, 2)
    flows.waits.submit(engine, 3, delay=timedelta(days=1))
    cyclone.Worker(engine, workflows=[flows.waits]).drain()
    flows.waits.submit(engine, 4)
    body = Client(create_app(engine)).get("/").get_data(as_text=True)
    row = re.search(rf"<tr>\s*<td><a [^>]*>{flows.waits.name}</a></td>(.*?)</tr>", body, re.S)
    assert row is not None
    cells = [text_of(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
    # running (a step due), waiting, sleeping, delayed, completed, failed, cancelled
    assert cells == ["1", "2", "0", "1", "0", "0", "0"]
    assert f'href="/runs?workflow={flows.waits.name}&amp;parked=waiting"' in body
