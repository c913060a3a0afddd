"""The dashboard's pages through a WSGI test client against real PostgreSQL."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from werkzeug.test import Client

import cyclone
from cyclone.dashboard import create_app
from tests.support.dashboard import Order, shop, text_of


@pytest.fixture
def client(engine: sa.Engine) -> Client:
    return Client(create_app(engine))


@pytest.fixture
def failed_run(engine: sa.Engine, name: str) -> cyclone.ResultRun[str]:
    s = shop(name)
    run, _ = s.workflow.submit_once(
        engine,
        "order:1",
        Order(1, "gift"),
        retention=timedelta(days=3),
        deadline=timedelta(hours=2),
    )
    s.worker(engine).drain()
    assert run.status().state == cyclone.RunState.FAILED
    return run


def test_overview_counts_runs_by_workflow_and_state(
    engine: sa.Engine, client: Client, name: str
) -> None:
    s = shop(name)
    s.workflow.submit_once(engine, "a", Order(1))
    s.workflow.submit_once(engine, "b", Order(2))
    s.worker(engine).drain()
    s.failing[0] = False
    s.workflow.submit_once(engine, "c", Order(3))
    s.worker(engine).drain()
    s.workflow.submit_once(engine, "d", Order(4))

    page = client.get("/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    row = re.search(rf"<tr>\s*<td><a [^>]*>{name}</a></td>(.*?)</tr>", html, re.S)
    assert row is not None
    cells = [text_of(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
    # running (not parked), waiting, sleeping, delayed, completed, failed, cancelled
    assert cells == ["1", "0", "0", "0", "1", "2", "0"]


def test_overview_counts_stop_at_the_cap_and_say_so(
    engine: sa.Engine, client: Client, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cyclone.dashboard import _app

    monkeypatch.setattr(_app, "COUNT_CAP", 2)
    s = shop(name)
    s.workflow.submit_once_many(engine, [(f"k{i}", Order(i)) for i in range(3)])
    html = client.get("/").get_data(as_text=True)
    row = re.search(rf"<tr>\s*<td><a [^>]*>{name}</a></td>(.*?)</tr>", html, re.S)
    assert row is not None
    cells = [text_of(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)]
    # three running, counted up to the cap; none waiting, sleeping or delayed; none ended
    assert cells == ["2+", "0", "0", "0", "0", "0", "0"]
    assert 'title="at least 2: the count stops there"' in row.group(1)


def test_overview_shows_backlog_by_queue_and_the_per_minute_chart(
    engine: sa.Engine, client: Client, name: str
) -> None:
    @cyclone.step(name, queue=name)
    def later(ctx: cyclone.StepContext, args: int) -> int:
        return args

    later.enqueue(engine, 1)
    later.enqueue(engine, 2)
    later.enqueue(engine, 3, delay=timedelta(hours=1))
    done = later.enqueue(engine, 4)
    with engine.begin() as c:
        c.execute(
            sa.text("UPDATE cyclone_jobs SET queue = 'x' || queue WHERE id = :id"), {"id": done.id}
        )
    cyclone.Worker(engine, steps=[later], queues={f"x{name}": 1}).drain()

    html = client.get("/").get_data(as_text=True)
    row = re.search(rf"<tr><td><a [^>]*>{name}</a></td>(.*?)</tr>", html, re.S)
    assert row is not None
    assert re.findall(r'<td class="num">(\d+)</td>', row.group(1)) == ["2", "1", "0"]
    assert '<svg class="chart"' in html
    minutes = re.findall(r"<title>(\d{4}-\d\d-\d\d \d\d:\d\d):00 UTC: (\d+) completed", html)
    assert len(minutes) == 60
    assert sum(int(n) for _, n in minutes) >= 1


def test_runs_page_filters_by_workflow_state_and_key(
    engine: sa.Engine, client: Client, name: str
) -> None:
    s = shop(name)
    s.workflow.submit_once(engine, "order:1", Order(1))
    s.workflow.submit_once(engine, "order:2", Order(2))
    s.worker(engine).drain()
    s.workflow.submit_once(engine, "order:30", Order(30))
    s.workflow.submit_once(engine, "other", Order(4))

    def keys(**query: str) -> list[str]:
        page = client.get("/runs", query_string={"workflow": name, **query})
        assert page.status_code == 200
        return re.findall(r'<td class="key">(.*?)</td>', page.get_data(as_text=True))

    assert keys() == ["other", "order:30", "order:2", "order:1"]
    assert keys(state="failed") == ["order:2", "order:1"]
    assert keys(key="order:3") == []  # a key matches exactly
    assert keys(key="order:30") == ["order:30"]
    assert keys(key="order:*") == ["order:30", "order:2", "order:1"]  # * at the end: a prefix
    assert keys(key="order:3*") == ["order:30"]
    assert keys(key="order_*") == []  # LIKE wildcards in the search box are plain characters
    assert keys(state="running", key="o*") == ["other", "order:30"]


def test_key_search_without_a_workflow_finds_the_key_in_every_workflow(
    engine: sa.Engine, client: Client, name: str
) -> None:
    for wf in (shop(f"{name}a").workflow, shop(f"{name}b").workflow):
        wf.submit_once(engine, f"shared:{name}", Order(1))
    page = client.get("/runs", query_string={"key": f"shared:{name}"}).get_data(as_text=True)
    rows = re.findall(r"<td>(\w+)</td>\s*<td class=\"key\">shared:", page)
    assert sorted(rows) == [f"{name}a", f"{name}b"]


def test_runs_page_filters_by_creation_time(engine: sa.Engine, client: Client, name: str) -> None:
    s = shop(name)
    old, _ = s.workflow.submit_once(engine, "old", Order(1))
    s.workflow.submit_once(engine, "new", Order(2))
    with engine.begin() as c:
        c.execute(
            sa.text("UPDATE cyclone_runs SET created_at = '2020-01-01T12:00:00Z' WHERE id = :id"),
            {"id": old.id},
        )

    def keys(**query: str) -> list[str]:
        page = client.get("/runs", query_string={"workflow": name, **query})
        return re.findall(r'<td class="key">(.*?)</td>', page.get_data(as_text=True))

    assert keys(until="2020-01-01T12:00:01") == ["old"]
    assert keys(since="2020-01-01T12:00:01") == ["new"]
    # An offset is honoured: 12:30+01:00 is 11:30 UTC, before the run; 13:30+01:00 after it.
    assert keys(since="2020-01-01T11:00", until="2020-01-01T12:30+01:00") == []
    assert keys(since="2020-01-01T11:00", until="2020-01-01T13:30+01:00") == ["old"]


def test_runs_page_paginates_by_keyset_without_repeats_or_gaps(
    engine: sa.Engine, client: Client, name: str
) -> None:
    s = shop(name)
    s.workflow.submit_once_many(engine, [(f"k{i:03d}", Order(i)) for i in range(120)])
    seen: list[str] = []
    url: str | None = f"/runs?workflow={name}"
    pages = 0
    while url is not None:
        html = client.get(url).get_data(as_text=True)
        seen += re.findall(r'<td class="key">(.*?)</td>', html)
        pages += 1
        following = re.search(r'<a class="next" href="([^"]+)"', html)
        if following is not None:
            s.workflow.submit_once(engine, f"late{pages}", Order(pages))  # newer: never listed
        url = None if following is None else following.group(1).replace("&amp;", "&")
    assert pages == 3
    assert sorted(seen) == [f"k{i:03d}" for i in range(120)]
    assert len(set(seen)) == 120


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"state": "exploded"}, "Unknown state &#39;exploded&#39;: use one of running"),
        ({"since": "yesterday"}, "&#39;since&#39; is not a date and time"),
        ({"after": "nonsense"}, "The page cursor is not valid"),
        ({"after": "2020-01-01T00:00:00+00:00~not-a-uuid"}, "The page cursor is not valid"),
        # A NUL in a text filter was the Client's ValueError: a 500 with its traceback.
        ({"workflow": "a\x00"}, "&#39;workflow&#39; holds a NUL character"),
        ({"key": "a\x00*"}, "&#39;key&#39; holds a NUL character"),
    ],
)
def test_runs_page_answers_bad_filters_with_400_and_the_reason(
    client: Client, query: dict[str, str], message: str
) -> None:
    page = client.get("/runs", query_string=query)
    assert page.status_code == 400
    assert message in page.get_data(as_text=True)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"queue": "a\x00"}, "&#39;queue&#39; holds a NUL character"),
        ({"kind": "a\x00"}, "&#39;kind&#39; holds a NUL character"),
        # A job id past bigint failed in the driver ("bigint out of range"): a 500.
        ({"after": f"2020-01-01T00:00:00+00:00~{2**63}"}, "The page cursor is not valid"),
    ],
)
def test_jobs_page_answers_bad_filters_with_400_and_the_reason(
    client: Client, query: dict[str, str], message: str
) -> None:
    page = client.get("/jobs", query_string=query)
    assert page.status_code == 400
    assert message in page.get_data(as_text=True)


@pytest.mark.parametrize("changed", ["\u00b2", "9" * 5000])
def test_a_bulk_notice_with_a_count_that_is_no_number_says_zero(
    client: Client, changed: str
) -> None:
    # "²" passed str.isdigit() and int() refused it; 5,000 digits passed it and int()
    # refused more than 4,300: a 500 each, for a link anyone can edit.
    page = client.get("/runs", query_string={"done": "retry-all", "changed": changed})
    assert page.status_code == 200
    assert "Retried 0 runs." in text_of(page.get_data(as_text=True))


def test_run_page_draws_the_dag_coloured_by_state_with_errors_and_tracebacks(
    client: Client, failed_run: cyclone.ResultRun[str]
) -> None:
    page = client.get(f"/runs/{failed_run.id}")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert sorted(re.findall(r'class="node node-(\w+)">\s*<title>(\w+):', html)) == [
        ("cancelled", "ship"),
        ("completed", "fetch"),
        ("completed", "notify"),
        ("failed", "charge"),
    ]
    # Layered by depth: fetch in the first column, ship in the last.
    xs = {
        n: int(x) for n, x in re.findall(r'<title>(\w+):.*?</title>\s*<rect x="(\d+)"', html, re.S)
    }
    assert xs["fetch"] < xs["charge"] == xs["notify"] < xs["ship"]
    assert html.count('<path class="edge"') == 4
    assert "charge: failed, attempt 2/2" in html
    assert "CardDeclined: card declined" in html
    assert html.count('<pre class="traceback">') >= 3  # two attempts and the run's error
    assert "Traceback (most recent call last)" in html
    assert "raise CardDeclined(message)" in html


def test_run_page_shows_input_result_retention_and_deadline(
    engine: sa.Engine, client: Client, name: str
) -> None:
    s = shop(name)
    s.failing[0] = False
    run, _ = s.workflow.submit_once(
        engine, "ok", Order(7, "gift"), retention=timedelta(days=3), deadline=timedelta(hours=2)
    )
    s.worker(engine).drain()
    html = client.get(f"/runs/{run.id}").get_data(as_text=True)
    # jsonb keeps keys shorter-first; each on its own indented line.
    assert "{\n  &#34;note&#34;: &#34;gift&#34;,\n  &#34;order_id&#34;: 7\n}" in html
    assert "&#34;shipped charged 7&#34;" in html
    assert "3 d 00 h after it finishes" in html
    deadline = run.status().deadline
    assert deadline is not None
    assert deadline.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") in html
    assert text_of(html).count("completed") >= 5


def test_the_run_page_names_times_and_counts_with_the_glossarys_words(
    engine: sa.Engine, client: Client, failed_run: cyclone.ResultRun[str]
) -> None:
    run_page = text_of(client.get(f"/runs/{failed_run.id}").get_data(as_text=True))
    for label in ("created", "finished", "retention", "steps remaining", "scheduled", "started"):
        assert re.search(rf"\b{label}\b", run_page), label
    for retired in ("ready since", "steps left", "no job"):
        assert retired not in run_page


def test_run_page_of_a_missing_run_is_404(client: Client) -> None:
    page = client.get("/runs/00000000-0000-0000-0000-000000000000")
    assert page.status_code == 404
    assert "There is no run 00000000-0000-0000-0000-000000000000" in page.get_data(as_text=True)
    assert client.get("/runs/not-a-uuid").status_code == 404


def test_jobs_page_counts_by_queue_and_kind_and_lists_standalone_jobs(
    engine: sa.Engine, client: Client, name: str
) -> None:
    @cyclone.step(name, queue=f"q{name}", max_attempts=1)
    def mail(ctx: cyclone.StepContext, args: dict[str, str]) -> None:
        if args["to"] == "bad":
            raise ValueError("no such mailbox")

    mail.enqueue(engine, {"to": "a"}, unique="welcome:a")
    mail.enqueue(engine, {"to": "bad"})
    cyclone.Worker(engine, steps=[mail]).drain()
    mail.enqueue(engine, {"to": "c"}, delay=timedelta(hours=1))
    waiting = mail.enqueue(engine, {"to": "b"})
    s = shop(f"{name}wf")
    s.workflow.submit(engine, Order(1))

    html = client.get("/jobs").get_data(as_text=True)
    row = re.search(rf"<td>q{name}</td>.*?</tr>", html, re.S)
    assert row is not None
    # ready now, scheduled later, running; finished jobs are not counted here
    assert re.findall(r'<td class="num">(\d+)</td>', row.group(0)) == ["1", "1", "0"]
    steps = re.search(rf">{name}wf</a></td>\s*<td>fetch</td>(.*?)</tr>", html, re.S)
    assert steps is not None  # workflow steps are counted under their workflow and step
    assert re.findall(r'<td class="num">(\d+)</td>', steps.group(1)) == ["1", "0", "0"]
    assert f">{name}wf</a></td>\n    <td>charge</td>" not in html  # blocked steps wait on runs

    listed = client.get("/jobs", query_string={"kind": name}).get_data(as_text=True)
    assert re.findall(r'<td><a href="/jobs/(\d+)">', listed)[0] == str(waiting.id)
    assert len(re.findall(r'<td><a href="/jobs/(\d+)">', listed)) == 4
    failed = client.get("/jobs", query_string={"kind": name, "state": "failed"})
    assert "no such mailbox" not in failed.get_data(as_text=True)
    failed_ids = re.findall(r'<td><a href="/jobs/(\d+)">', failed.get_data(as_text=True))
    assert len(failed_ids) == 1

    job_page = client.get(f"/jobs/{failed_ids[0]}").get_data(as_text=True)
    assert "ValueError</strong>: no such mailbox" in job_page
    assert "&#34;to&#34;: &#34;bad&#34;" in job_page
    assert client.get("/jobs/999999999").status_code == 404


def test_jobs_page_paginates(engine: sa.Engine, client: Client, name: str) -> None:
    @cyclone.step(name)
    def noop(ctx: cyclone.StepContext, args: int) -> None:
        return None

    for i in range(60):
        noop.enqueue(engine, i)
    first = client.get("/jobs", query_string={"kind": name}).get_data(as_text=True)
    nxt = re.search(r'<a class="next" href="([^"]+)"', first)
    assert nxt is not None
    second = client.get(nxt.group(1).replace("&amp;", "&")).get_data(as_text=True)
    ids = re.findall(r'<td><a href="/jobs/(\d+)">', first) + re.findall(
        r'<td><a href="/jobs/(\d+)">', second
    )
    assert len(ids) == len(set(ids)) == 60
    assert '<a class="next"' not in second


def test_static_stylesheet_ships_in_the_package_and_pages_send_security_headers(
    client: Client,
) -> None:
    css = client.get("/static/style.css")
    assert css.status_code == 200
    assert css.mimetype == "text/css"
    assert b"svg.dag" in css.get_data()
    assert client.get("/static/nope.css").status_code == 404
    assert client.get("/static/..%2F_app.py").status_code == 404
    page = client.get("/")
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy
    # The one script is the dashboard's own file: no inline script, nothing from elsewhere.
    assert "script-src 'self';" in policy
    assert "connect-src 'self';" in policy
    assert "unsafe-inline" not in policy
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Cache-Control"] == "no-store"
    html = page.get_data(as_text=True)
    assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/live.js" defer>']
    assert '<body data-refresh="5.0">' in html
    script = client.get("/static/live.js")
    assert (script.status_code, script.mimetype) == (200, "text/javascript")
    assert b"http" not in script.get_data()  # fetches its own page only, no CDN


def test_links_and_forms_honour_the_mount_point(engine: sa.Engine, name: str) -> None:
    s = shop(name)
    s.workflow.submit_once(engine, "k", Order(1))
    client = Client(create_app(engine, title="Ops"))
    page = client.get(
        "/runs", query_string={"workflow": name}, environ_overrides={"SCRIPT_NAME": "/ops/cyclone"}
    )
    html = page.get_data(as_text=True)
    assert '<link rel="stylesheet" href="/ops/cyclone/static/style.css">' in html
    assert re.search(r'href="/ops/cyclone/runs/[0-9a-f-]{36}"', html)
    assert '<form class="filters" method="get" action="/ops/cyclone/runs">' in html
    assert "<title>Runs · Ops</title>" in html
    assert "Path=/ops/cyclone/" in page.headers["Set-Cookie"]


def test_create_app_refuses_what_is_not_an_engine() -> None:
    with pytest.raises(TypeError, match="create_app takes a SQLAlchemy Engine, not str"):
        create_app("postgresql://x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        # A browser runs a setInterval past 2**31 - 1 ms at once: every open page fetched
        # itself again without pause (NaN and infinity were taken too).
        ({"refresh": 3_000_000}, ValueError, "refresh must be seconds from 0"),
        ({"refresh": float("nan")}, ValueError, "refresh must be seconds from 0"),
        ({"refresh": float("inf")}, ValueError, "refresh must be seconds from 0"),
        # Failed every request with a 500 ("'int' object is not callable").
        ({"authorize": 5}, TypeError, "authorize must be callable or None, not int"),
        # bytes(5) signed the CSRF tokens with five zero bytes, which anyone knows.
        ({"secret": 5}, TypeError, "secret must be a str or bytes, not int"),
        ({"secret": ""}, ValueError, "secret must not be empty"),
    ],
)
def test_create_app_refuses_options_it_would_fail_or_be_unsafe_on(
    engine: sa.Engine, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        create_app(engine, **options)


def test_create_app_takes_the_longest_refresh_and_a_bytes_secret(engine: sa.Engine) -> None:
    page = Client(create_app(engine, refresh=2_147_483, secret=b"k")).get("/")
    assert page.status_code == 200
    assert '<body data-refresh="2147483">' in page.get_data(as_text=True)


def test_formatting_of_json_durations_and_times() -> None:
    from cyclone.dashboard import _format

    assert _format.pretty({"a": [1]}) == json.dumps({"a": [1]}, indent=2)
    assert _format.pretty(None) == "null"
    huge = _format.pretty("x" * (_format.MAX_SHOWN + 10))
    assert huge.endswith("… (12 more characters not shown)")  # 10 and the two quotes
    assert _format.duration(timedelta(milliseconds=850)) == "850 ms"
    assert _format.duration(timedelta(seconds=245)) == "4 min 05 s"
    assert _format.when(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)) == "2026-01-02 03:04:05 UTC"


def test_a_key_prefix_reads_a_bounded_window_per_page_and_a_state_its_index(
    engine: sa.Engine, client: Client, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cyclone.dashboard import _app

    monkeypatch.setattr(_app, "SCAN_LIMIT", 5)
    s = shop(name)
    s.workflow.submit_once_many(engine, [(f"old{i}", Order(i)) for i in range(2)])
    s.worker(engine).drain()  # the two oldest runs fail
    s.workflow.submit_once_many(engine, [(f"new{i:02d}", Order(i)) for i in range(10)])

    failed = client.get(f"/runs?workflow={name}&state=failed").get_data(as_text=True)
    assert sorted(re.findall(r'<td class="key">(.*?)</td>', failed)) == ["old0", "old1"]
    assert "runs read for this page" not in failed  # the state index answers at once

    found: list[str] = []
    notices = 0
    url: str | None = f"/runs?workflow={name}&key=old*"
    while url is not None:
        html = client.get(url).get_data(as_text=True)
        found += re.findall(r'<td class="key">(.*?)</td>', html)
        notices += "the next page searches the runs created before" in html
        following = re.search(r'<a class="next" href="([^"]+)"', html)
        url = None if following is None else following.group(1).replace("&amp;", "&")
    assert sorted(found) == ["old0", "old1"]
    assert notices == 2  # 12 runs, 5 read per page: two pages stop at the window's edge
    prefix = client.get("/runs", query_string={"workflow": name, "key": "new0*"})
    assert "the next page searches" in prefix.get_data(as_text=True)
    shown = re.findall(r'<td class="key">(.*?)</td>', prefix.get_data(as_text=True))
    assert len(shown) == 5  # the five runs of the window, all matching
    assert all(key.startswith("new0") for key in shown)
