"""Dashboard request times with many runs (1,000,000 for the figures in bench/README.md).

Run by hand: ``python -m bench.dashboard [--runs N] [--jobs N] [--repeat N] [--url URL]
[--keep | --reuse DATABASE]``. It creates a throwaway database, submits one run of each of
five workflows of four steps through cyclone and clones them by ``INSERT ... SELECT
generate_series`` (runs and their steps in one statement per 100,000 runs, created in
order over the last day: 90% completed, 5% failed in ``charge`` with error records, 5%
running with their root available), adds ``--jobs`` standalone jobs (a tenth of the runs
by default: 94% completed, 3% failed, 3% due) and twelve schedules, runs ``VACUUM
ANALYZE``, then times every page through werkzeug's test client (in process: queries and
rendering, no HTTP) and prints the median and p90 of ``--repeat`` requests per page, after
three untimed ones. The database is dropped at the end, unless ``--keep`` (then
``--reuse DATABASE`` times it again, after ``cyclone.upgrade``).
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


TEMPLATE_RUN = (
    "SELECT CAST(r.definition AS text), d.graph FROM cyclone_runs r "
    "JOIN cyclone_definitions d ON d.id = r.definition WHERE r.workflow = :workflow LIMIT 1"
)

# One batch of runs and their steps in one statement, cloned from each workflow's graph:
# runs ``g`` in [first, last] of ``total``, created in order over the last day (as they
# would have been submitted), every 20th running, every 20th + 1 failed in ``charge``,
# the rest completed. A running run's root is available and its other steps blocked.
LOAD_RUNS = """
WITH template AS (
    SELECT n - 1 AS n, workflow, CAST(definition AS uuid) AS definition
    FROM unnest(CAST(:workflows AS text[]), CAST(:definitions AS text[]))
        WITH ORDINALITY AS t(workflow, definition, n)
), made AS (
    INSERT INTO cyclone_runs (workflow, submit_key, input, definition, state, steps_remaining,
                              failed_step, error, created_at, finalized_at)
    SELECT t.workflow, 'order:' || g,
           jsonb_build_object('order_id', g, 'lines',
               jsonb_build_array(jsonb_build_object('sku', 'sku-' || g % 97, 'qty', 1))),
           t.definition,
           CASE g % 20 WHEN 0 THEN 'running' WHEN 1 THEN 'failed' ELSE 'completed' END,
           CASE g % 20 WHEN 0 THEN 4 WHEN 1 THEN 2 ELSE 0 END,
           CASE g % 20 WHEN 1 THEN 'charge' END,
           CASE g % 20 WHEN 1 THEN CAST(:error AS jsonb) -> 0 END,
           c.at,
           CASE g % 20 WHEN 0 THEN NULL WHEN 1 THEN c.at + interval '1 second'
                ELSE c.at + interval '2 seconds' END
    FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    JOIN template t ON t.n = (g / 1000) % :kinds
    CROSS JOIN LATERAL (
        SELECT now() - interval '1 day' * (1 - CAST(g AS float8) / :total) AS at
    ) c
    RETURNING id, workflow, definition, state, created_at, finalized_at
)
INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, priority, state, deps, pending_deps,
                          attempt, max_attempts, errors, output, scheduled_at, created_at,
                          attempted_at, finalized_at)
SELECT r.id, r.workflow, s.name, s.queue, s.priority, j.state, s.after,
       CASE WHEN j.state = 'blocked' THEN cardinality(s.after) ELSE 0 END,
       CASE WHEN j.state = 'failed' THEN 3 WHEN j.state = 'completed' THEN 1 ELSE 0 END,
       CASE WHEN s.name = 'charge' THEN 3 ELSE s.max_attempts END,
       CASE WHEN j.state = 'failed' THEN CAST(:error AS jsonb) ELSE jsonb '[]' END,
       CASE WHEN j.state = 'completed' THEN jsonb 'null' END,
       r.created_at, r.created_at,
       CASE WHEN j.state IN ('completed', 'failed') THEN r.created_at END,
       CASE WHEN j.state IN ('completed', 'failed', 'cancelled') THEN r.finalized_at END
FROM made r
JOIN cyclone_definitions d ON d.id = r.definition
CROSS JOIN LATERAL jsonb_array_elements(d.graph -> 'steps') WITH ORDINALITY AS e(step, ord)
CROSS JOIN LATERAL jsonb_to_record(e.step)
    AS s(name text, after text[], max_attempts integer, queue text, priority smallint)
CROSS JOIN LATERAL (
    SELECT CASE
        WHEN r.state = 'completed' THEN 'completed'
        WHEN r.state = 'running' THEN
            CASE WHEN cardinality(s.after) = 0 THEN 'available' ELSE 'blocked' END
        WHEN s.name = 'charge' THEN 'failed'
        WHEN s.name = 'ship' THEN 'cancelled'
        ELSE 'completed'
    END AS state
) j
ORDER BY r.created_at, e.ord
"""

# Standalone jobs, created over the last day: 94% completed, 3% failed, 3% due now.
LOAD_JOBS = """
INSERT INTO cyclone_jobs (kind, queue, state, args, output, attempt, max_attempts, errors,
                          scheduled_at, created_at, attempted_at, finalized_at)
SELECT k.kind, k.queue, st.state, jsonb_build_object('to', 'user' || g || '@example.com'),
       CASE st.state WHEN 'completed' THEN jsonb 'null' END,
       CASE st.state WHEN 'available' THEN 0 ELSE 1 END, 1,
       CASE st.state WHEN 'failed' THEN CAST(:error AS jsonb) ELSE jsonb '[]' END,
       c.at, c.at,
       CASE WHEN st.state <> 'available' THEN c.at END,
       CASE WHEN st.state <> 'available' THEN c.at + interval '1 second' END
FROM generate_series(1, CAST(:count AS bigint)) AS g
CROSS JOIN LATERAL (
    SELECT now() - interval '1 day' * (1 - CAST(g AS float8) / :count) AS at
) c
CROSS JOIN LATERAL (
    SELECT CASE g % 2 WHEN 0 THEN 'send_email' ELSE 'render_pdf' END AS kind,
           CASE g % 2 WHEN 0 THEN 'mail' ELSE 'default' END AS queue
) k
CROSS JOIN LATERAL (
    SELECT CASE WHEN g % 100 < 3 THEN 'failed' WHEN g % 100 < 6 THEN 'available'
                ELSE 'completed' END AS state
) st
"""

LOAD_SCHEDULES = """
INSERT INTO cyclone_schedules (name, workflow, every, timezone, missed, max_catch_up, last_tick)
SELECT 'every-' || g || 'm', (CAST(:workflows AS text[]))[1 + g % cardinality(:workflows)],
       interval '1 minute' * g, 'UTC', 'latest', 1, date_trunc('minute', now())
FROM generate_series(1, 12) AS g
"""

ERROR = (
    '[{"type": "CardDeclined", "message": "card declined", "attempt": 3, "step": "charge",'
    ' "at": "2026-01-01T00:00:00+00:00", "traceback": "Traceback (most recent call last):'
    '\\n  File \\"shop.py\\", line 12, in charge\\nCardDeclined: card declined\\n"}]'
)


def load(engine: sa.Engine, runs: int, standalone: int, batch: int = 100_000) -> None:
    """Load ``runs`` runs (four steps each) and ``standalone`` standalone jobs, by SQL.

    One run of each workflow is submitted through cyclone and its graph cloned by
    ``INSERT ... SELECT generate_series`` for the rest, steps created as a worker's claim
    would, in batches of ``batch`` runs; then ``VACUUM ANALYZE``.
    """
    started = time.perf_counter()
    definitions = []
    with engine.begin() as c:
        for name in WORKFLOWS:
            # The definition cyclone stores, which the cloned runs name.
            define(name).submit_tx(c, {"order_id": 0, "lines": []})
            definition, _graph = c.execute(sa.text(TEMPLATE_RUN), {"workflow": name}).one()
            definitions.append(definition)
        c.execute(sa.text("DELETE FROM cyclone_runs"))
    common = {"workflows": list(WORKFLOWS), "definitions": definitions, "kinds": len(WORKFLOWS)}
    for first in range(1, runs + 1, batch):
        last = min(first + batch - 1, runs)
        with engine.begin() as c:
            c.execute(
                sa.text(LOAD_RUNS),
                {**common, "first": first, "last": last, "total": runs, "error": ERROR},
            )
        print(f"  {last:,} runs", end="\r", flush=True)
    with engine.begin() as c:
        if standalone:
            c.execute(sa.text(LOAD_JOBS), {"count": standalone, "error": ERROR})
        c.execute(sa.text(LOAD_SCHEDULES), {"workflows": list(WORKFLOWS)})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(sa.text("VACUUM ANALYZE cyclone_runs, cyclone_jobs, cyclone_schedules"))
        pages = c.execute(
            sa.text("SELECT relpages FROM pg_class WHERE relname = 'cyclone_runs'")
        ).scalar_one()
    print(f"cyclone_runs: {pages:,} pages of 8 kB")
    print(
        f"loaded {runs:,} runs ({4 * runs:,} steps) and {standalone:,} standalone jobs"
        f" in {time.perf_counter() - started:.1f} s"
    )


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


def pages_to_time(client: Client, engine: sa.Engine) -> dict[str, str]:
    """Label -> URL of every page timed: each page of the dashboard, the runs list under
    each filter (every state among them), deep pages of the listings."""
    with engine.connect() as c:
        failed = c.execute(
            sa.text("SELECT id FROM cyclone_runs WHERE state = 'failed' LIMIT 1")
        ).scalar_one()
        running = c.execute(
            sa.text("SELECT id FROM cyclone_runs WHERE state = 'running' LIMIT 1")
        ).scalar_one()
        job = c.execute(
            sa.text("SELECT id FROM cyclone_jobs WHERE run_id IS NULL LIMIT 1")
        ).scalar_one_or_none()
        day_ago = c.execute(sa.text("SELECT now() - interval '12 hours'")).scalar_one()
    since = day_ago.strftime("%Y-%m-%dT%H:%M:%S")
    pages = {
        "overview": "/",
        "run page (failed run, DAG + errors)": f"/runs/{failed}",
        "run page (running run)": f"/runs/{running}",
        "runs list, first page": "/runs",
        "runs list, page 41 (keyset)": deep_page(client, "/runs", 40),
    }
    for state in cyclone.RunState:
        pages[f"runs list, state={state.value}"] = f"/runs?state={state.value}"
    pages["runs list, state=failed, page 11"] = deep_page(client, "/runs?state=failed", 10)
    for state in cyclone.RunState:
        pages[f"runs list, refund + state={state.value}"] = (
            f"/runs?workflow=refund&state={state.value}"
        )
    pages.update(
        {
            "runs list, workflow filter": "/runs?workflow=refund",
            "runs list, key (exact, any workflow)": "/runs?key=order:4242",
            "runs list, key prefix order:4242*": "/runs?key=order:4242*",
            "runs list, workflow + key prefix": "/runs?workflow=checkout&key=order:1*",
            "runs list, since 12 h ago": f"/runs?since={since}",
            "jobs page": "/jobs",
            "jobs page, state=failed": "/jobs?state=failed",
            "schedules page": "/schedules",
        }
    )
    if job is not None:
        pages["job page"] = f"/jobs/{job}"
    return pages


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument(
        "--jobs", type=int, default=None, help="standalone jobs (default: a tenth of --runs)"
    )
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--url", default=os.environ.get("CYCLONE_DATABASE_URL"))
    parser.add_argument(
        "--keep", action="store_true", help="keep the loaded database (its URL is printed)"
    )
    parser.add_argument(
        "--reuse", metavar="DATABASE", help="time a database --keep left (upgraded first)"
    )
    args = parser.parse_args(argv)
    admin_url = make_url(args.url or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    url = admin_url.set(database=args.reuse) if args.reuse else create_database(admin_url)
    engine = sa.create_engine(url)
    try:
        cyclone.upgrade(engine)
        if not args.reuse:
            standalone = args.runs // 10 if args.jobs is None else args.jobs
            load(engine, args.runs, standalone)
        client = Client(create_app(engine))
        pages = pages_to_time(client, engine)
        print(f"{'page':<40} {'median ms':>10} {'p90 ms':>8}   ({args.repeat} requests each)")
        for label, page in pages.items():
            median, p90 = measure(client, page, args.repeat)
            print(f"{label:<40} {median:>10.1f} {p90:>8.1f}")
    finally:
        engine.dispose()
        if args.keep or args.reuse:
            print(f"kept database {url.database}")
        else:
            drop_database(admin_url, url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
