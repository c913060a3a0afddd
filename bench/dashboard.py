"""Dashboard request times with 100,000 runs (400,000 steps) in cyclone's tables.

Run by hand: ``python -m bench.dashboard [--runs N] [--repeat N] [--url URL]``. It creates
a throwaway database, submits the runs with ``submit_once_many`` (five workflows of four
steps), gives them a realistic mix of states (90% completed, 5% failed with error
records, 5% running), runs ``ANALYZE``, then times each page through werkzeug's test
client (in process: rendering and queries, no HTTP) and prints the median and p90 of
``--repeat`` requests per page. The database is dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from werkzeug.test import Client

import cyclone
from bench.db import create_database, drop_database
from cyclone.dashboard import create_app

WORKFLOWS = ("checkout", "invoice", "onboarding", "refund", "report")
BATCH = 1_000


def define(name: str) -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def fetch(ctx: cyclone.StepContext, value: Any) -> None: ...

    @wf.step(after=[fetch])
    def charge(ctx: cyclone.StepContext, value: Any) -> None: ...

    @wf.step(after=[fetch])
    def notify(ctx: cyclone.StepContext, value: Any) -> None: ...

    @wf.step(after=[charge, notify])
    def ship(ctx: cyclone.StepContext, value: Any) -> None: ...

    return wf


CREATE_STEPS = """
WITH started AS (
    UPDATE cyclone_runs SET start_at = NULL WHERE start_at IS NOT NULL
    RETURNING id, workflow, graph, deadline, created_at
)
INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, priority, state, deps, pending_deps,
                          max_attempts, deadline, created_at)
SELECT r.id, r.workflow, s.name, s.queue, s.priority,
       CASE WHEN cardinality(s.after) = 0 THEN 'available' ELSE 'blocked' END,
       s.after, cardinality(s.after), s.max_attempts, r.deadline, r.created_at
FROM started r
CROSS JOIN LATERAL jsonb_array_elements(r.graph -> 'steps') WITH ORDINALITY AS e(step, ord)
CROSS JOIN LATERAL jsonb_to_record(e.step)
    AS s(name text, after text[], max_attempts integer, queue text, priority smallint)
ORDER BY r.id, e.ord
"""


def load(engine: sa.Engine, runs: int) -> None:
    """Submit ``runs`` runs, then settle 95% of them: completed, or failed in ``charge``."""
    started = time.perf_counter()
    workflows = [define(name) for name in WORKFLOWS]
    for first in range(0, runs, BATCH):
        wf = workflows[(first // BATCH) % len(workflows)]
        items = [
            (f"order:{i}", {"order_id": i, "lines": [{"sku": f"sku-{i % 97}", "qty": 1}]})
            for i in range(first, min(first + BATCH, runs))
        ]
        wf.submit_once_many(engine, items)
    error = (
        '[{"type": "CardDeclined", "message": "card declined", "attempt": 1, "step": "charge",'
        ' "at": "2026-01-01T00:00:00+00:00", "traceback": "Traceback (most recent call last):'
        '\\n  File \\"shop.py\\", line 12, in charge\\nCardDeclined: card declined\\n"}]'
    )
    with engine.begin() as c:
        # Start every run as a worker's claim would: create its steps from its graph.
        c.execute(sa.text(CREATE_STEPS))
        # Spread creation over the last day; every 20th run stays running, every 20th+1 fails.
        c.execute(
            sa.text("UPDATE cyclone_runs SET created_at = now() - random() * interval '1 day'")
        )
        c.execute(
            sa.text(
                "UPDATE cyclone_runs SET state = 'completed', steps_remaining = 0,"
                " finalized_at = created_at + interval '2 seconds'"
                " WHERE (substr(submit_key, 7)::int % 20) > 1"
            )
        )
        c.execute(
            sa.text(
                "UPDATE cyclone_runs SET state = 'failed', failed_step = 'charge',"
                " error = (CAST(:e AS jsonb)) -> 0,"
                " finalized_at = created_at + interval '1 second'"
                " WHERE (substr(submit_key, 7)::int % 20) = 1"
            ),
            {"e": error},
        )
        c.execute(
            sa.text(
                "UPDATE cyclone_jobs j SET state = 'completed', attempt = 1, output = 'null',"
                " attempted_at = r.created_at, finalized_at = r.finalized_at, pending_deps = 0"
                " FROM cyclone_runs r WHERE j.run_id = r.id AND r.state = 'completed'"
            )
        )
        c.execute(
            sa.text(
                "UPDATE cyclone_jobs j SET state = CASE j.kind WHEN 'charge' THEN 'failed'"
                " WHEN 'ship' THEN 'cancelled' ELSE 'completed' END,"
                " attempt = CASE j.kind WHEN 'ship' THEN 0 WHEN 'charge' THEN 3 ELSE 1 END,"
                " errors = CASE j.kind WHEN 'charge' THEN CAST(:e AS jsonb) ELSE '[]' END,"
                " attempted_at = r.created_at, finalized_at = r.finalized_at, pending_deps = 0"
                " FROM cyclone_runs r WHERE j.run_id = r.id AND r.state = 'failed'"
            ),
            {"e": error},
        )
        c.execute(sa.text("UPDATE cyclone_jobs SET max_attempts = 3 WHERE kind = 'charge'"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(sa.text("VACUUM ANALYZE cyclone_runs, cyclone_jobs"))
    with engine.connect() as c:
        pages = c.execute(
            sa.text("SELECT relpages FROM pg_class WHERE relname = 'cyclone_runs'")
        ).scalar_one()
    print(f"cyclone_runs: {pages:,} pages of 8 kB")
    print(f"loaded {runs:,} runs ({4 * runs:,} steps) in {time.perf_counter() - started:.1f} s")


def measure(client: Client, url: str, repeat: int) -> tuple[float, float]:
    for _ in range(3):
        assert client.get(url).status_code == 200, url
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        response.get_data()
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, url
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.9) - 1]


def deep_page(client: Client, url: str, pages: int) -> str:
    """The URL of page ``pages`` + 1 of a listing, following its next-page links."""
    for _ in range(pages):
        html = client.get(url).get_data(as_text=True)
        found = re.search(r'<a class="next" href="([^"]+)"', html)
        assert found is not None, "the listing ended early"
        url = found.group(1).replace("&amp;", "&")
    return url


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--url", default=os.environ.get("CYCLONE_DATABASE_URL"))
    args = parser.parse_args(argv)
    admin_url = make_url(args.url or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    url = create_database(admin_url)
    engine = sa.create_engine(url)
    try:
        cyclone.upgrade(engine)
        load(engine, args.runs)
        client = Client(create_app(engine))
        with engine.connect() as c:
            failed = c.execute(
                sa.text("SELECT id FROM cyclone_runs WHERE state = 'failed' LIMIT 1")
            ).scalar_one()
            day_ago = c.execute(sa.text("SELECT now() - interval '12 hours'")).scalar_one()
        since = day_ago.strftime("%Y-%m-%dT%H:%M:%S")
        pages = {
            "run page (failed run, DAG + errors)": f"/runs/{failed}",
            "runs list, first page": "/runs",
            "runs list, page 41 (keyset)": deep_page(client, "/runs", 40),
            "runs list, workflow filter": "/runs?workflow=refund",
            "runs list, state=failed": "/runs?state=failed",
            "runs list, key (exact, any workflow)": "/runs?key=order:4242",
            "runs list, key prefix order:4242*": "/runs?key=order:4242*",
            "runs list, workflow + key prefix": "/runs?workflow=checkout&key=order:1*",
            "runs list, state=cancelled (none)": "/runs?state=cancelled",
            "runs list, since 12 h ago": f"/runs?since={since}",
            "overview": "/",
            "jobs page": "/jobs",
        }
        print(f"{'page':<40} {'median ms':>10} {'p90 ms':>8}   ({args.repeat} requests each)")
        for label, page in pages.items():
            median, p90 = measure(client, page, args.repeat)
            print(f"{label:<40} {median:>10.1f} {p90:>8.1f}")
    finally:
        engine.dispose()
        drop_database(admin_url, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
