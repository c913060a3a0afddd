"""Profiles behind the benchmark's unmet goals (run by hand; needs pyinstrument).

    .venv/bin/pip install pyinstrument py-spy
    .venv/bin/python -m bench.profile submit       # pyinstrument of submit_once, new + existing
    .venv/bin/python -m bench.profile drain        # where a Worker.drain() spends its time
    .venv/bin/python -m bench.profile ping         # timeline of one submit -> result()
    .venv/bin/python -m bench.profile explain      # server-side EXPLAIN ANALYZE of hot statements
    .venv/bin/python -m bench.profile parts        # the submit statement's cost, part by part
    .venv/bin/python -m bench.profile calls        # a new key's time, client path by path
    .venv/bin/python -m bench.profile notify       # 8 submitters: raw, raw + NOTIFY, cyclone
    .venv/bin/python -m bench.profile unprepared   # figure k: statements planned on every call
    .venv/bin/python -m bench.profile start        # a drain's fixed cost: drains of an empty queue
    .venv/bin/python -m bench.profile writes       # WAL, row versions, index entries per step
    .venv/bin/python -m bench.profile ids --size 2000000   # random against time-ordered run ids

Each creates and drops its own throwaway database, like ``bench.run``. The profiles are
in ``bench/profiles/``, one module per question.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from bench import db
from bench.profiles import drain, ids, notify, ping, statements, submit, writes

CHOICES = [
    "submit",
    "drain",
    "drain-wf",
    "ping",
    "explain",
    "parts",
    "calls",
    "notify",
    "unprepared",
    "start",
    "writes",
    "ids",
]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile")
    parser.add_argument("what", choices=CHOICES)
    parser.add_argument("-n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--size", type=int, default=1_000_000, help="ids: runs filled first")
    parser.add_argument("--turns", type=int, default=6, help="ids: turns per variant")
    parser.add_argument("--url", default=os.environ.get("CYCLONE_DATABASE_URL", db.DEFAULT_URL))
    args = parser.parse_args()
    if args.what == "parts":
        statements.parts(args.url, args.n)
        return
    if args.what == "ids":
        ids.ids(args.url, args.n, args.size, args.turns)
        return
    with db.throwaway(make_url(args.url)) as url:
        engine = sa.create_engine(url, pool_size=10)
        try:
            if args.what == "submit":
                submit.profile_submit(engine, args.n)
            elif args.what == "drain":
                drain.profile_drain(engine, args.n, "jobs", args.concurrency)
            elif args.what == "drain-wf":
                drain.profile_drain(engine, args.n, "workflow", args.concurrency)
            elif args.what == "ping":
                ping.profile_ping(engine, min(args.n, 500))
            elif args.what == "calls":
                submit.calls(engine, args.n)
            elif args.what == "notify":
                notify.notify(engine, args.n)
            elif args.what == "unprepared":
                statements.unprepared(engine, args.n)
            elif args.what == "start":
                drain.start(engine, min(args.n, 50))
            elif args.what == "writes":
                writes.writes(engine, args.n)
            else:
                statements.explain(engine)
        finally:
            engine.dispose()


if __name__ == "__main__":
    main()
