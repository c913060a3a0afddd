"""cyclone's benchmark: every figure for cyclone and the raw psycopg baseline.

Run from the repository root (never from the test suite)::

    .venv/bin/python -m bench.run                 # full run: 5 rounds, ~6 minutes
    .venv/bin/python -m bench.run --quick         # small N, a smoke run
    .venv/bin/python -m bench.run --only a,b      # some figures only

It creates a throwaway database on the server, runs ``cyclone.upgrade``, measures, prints
a table of medians over rounds with the cyclone/raw ratio and each goal, writes
``bench/results/latest.json`` and ``bench/results/latest.png`` (copied to
``docs/bench.png``), and drops the database. The figures live in ``bench/figures/``,
one module per group.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/run.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from bench import db, figures, report, results, statements
from bench.harness import Bench, Sizes
from bench.results import RESULTS, Figure


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; 2 in --quick)")
    parser.add_argument("--quick", action="store_true", help="small N: a smoke run")
    parser.add_argument(
        "--only", default=figures.LETTERS, help="figures to run, e.g. 'a' or 'a,d' (default: all)"
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("CYCLONE_DATABASE_URL", db.DEFAULT_URL),
        help="server URL (a throwaway database is created on it)",
    )
    parser.add_argument("--concurrency", type=int, default=4, help="Worker(concurrency=...)")
    parser.add_argument("--no-statements", action="store_true", help="skip statement counts")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--report",
        action="store_true",
        help="measure nothing: print the table and redraw the chart from latest.json",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="minutes: start no round that would end after this (default 60)",
    )
    return parser.parse_args(argv)


STOP = threading.Event()


def _on_signal(signum: int, frame: Any) -> None:
    print(f"signal {signum}: finishing the current figure, then reporting", flush=True)
    STOP.set()


def ordered(found: dict[str, Figure]) -> list[Figure]:
    """The recorded figures in the table's order."""
    order = {fid: i for i, fid in enumerate(figures.ORDER)}
    return sorted(found.values(), key=lambda f: order.get(f.id, len(order)))


def draw(rows: list[Figure], meta: dict[str, Any]) -> None:
    """The chart to ``latest.png``, copied to ``docs/bench.png``."""
    report.chart(rows, RESULTS / "latest.png", meta)
    report.publish(RESULTS / "latest.png", "bench.png")


def write_results(
    bench: Bench, meta: dict[str, Any], started: float, *, chart_too: bool, show: bool = False
) -> None:
    """Rewrite ``latest.json`` with what is measured so far (and print, and draw)."""
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["loadavg_end"] = os.getloadavg()
    rows = ordered(bench.figures)
    if show:
        print()
        report.print_figures(rows, bench.statements)
    results.save(
        "latest.json",
        {
            "meta": meta,
            "figures": [f.to_json() for f in rows],
            "statements": bench.statements,
            "markdown": report.markdown(report.HEADERS, report.table_rows(rows)),
        },
    )
    if chart_too:
        try:
            draw(rows, meta)
        except Exception as exc:  # the numbers matter more than the picture
            print(f"no chart: {exc!r}", file=sys.stderr)


def report_only() -> int:
    """Print the table and redraw the chart of the last run from ``latest.json``."""
    data = results.load("latest.json")
    rows = [Figure.from_json(f) for f in data["figures"]]
    report.print_figures(rows, data["statements"])
    draw(rows, data["meta"])
    return 0


def run_figures(
    bench: Bench, only: set[str], meta: dict[str, Any], started: float, budget: float
) -> None:
    """The rounds of figures a to e, then g to l once each, then f; results after each."""
    setup = 0.0
    done = 0
    for r in range(bench.rounds):
        elapsed = time.perf_counter() - started
        per_round = (elapsed - setup) / done if done else 0.0
        if STOP.is_set() or (done and elapsed + per_round > budget * 60):
            print(f"stopping after {done} rounds ({elapsed:.0f} s elapsed)")
            break
        if r == 0:
            setup = elapsed
        for letter, figure in figures.ROUNDS.items():
            if letter in only and not STOP.is_set():
                # Empty tables for every figure: a figure's leftovers (such as the
                # available jobs of a, b and c, which no drain worker of d serves) would
                # otherwise be read past by the next figure's statements.
                bench.reset()
                t0 = time.perf_counter()
                figure(bench, r)
                took = time.perf_counter() - t0
                print(f"round {r + 1}/{bench.rounds} figure {letter}: {took:.1f} s", flush=True)
        if STOP.is_set():
            break
        done += 1
        meta["rounds_done"] = done
        write_results(bench, meta, started, chart_too=False)
    for letter, once in (*figures.ONCE.items(), *figures.LAST.items()):
        if letter in only and not STOP.is_set():
            t0 = time.perf_counter()
            once(bench)
            print(f"figure {letter}: {time.perf_counter() - t0:.1f} s", flush=True)
            write_results(bench, meta, started, chart_too=False)
    meta["rounds_done"] = done


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        return report_only()
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    rounds = args.rounds or (2 if args.quick else 5)
    only = {c for c in args.only.lower() if c in figures.LETTERS}
    admin_url = make_url(args.url)
    started = time.perf_counter()
    with db.throwaway(admin_url) as url:
        print(f"database {url.database} on {url.host}:{url.port}; rounds={rounds}, {sizes}")
        bench = Bench(url, sizes, rounds, args.concurrency)
        try:
            meta = results.meta(
                db.show(bench.dsn, "server_version"),
                synchronous_commit=db.show(bench.dsn, "synchronous_commit"),
                sqlalchemy=sa.__version__,
                psycopg=psycopg.__version__,
                msgspec=msgspec.__version__,
                rounds=rounds,
                sizes=asdict(sizes),
                concurrency=args.concurrency,
                quick=args.quick,
                only="".join(sorted(only)),
            )
            if not args.no_statements:
                bench.reset()
                statements.count_statements(bench)
            run_figures(bench, only, meta, started, args.budget)
            write_results(bench, meta, started, chart_too=not args.no_chart, show=True)
            print(f"total {meta['seconds']:.0f} s")
        finally:
            bench.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
