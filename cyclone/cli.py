"""The ``cyclone`` console script: migrate, run a worker, list runs, purge."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine, create_engine

from cyclone import migrations
from cyclone.client import Client
from cyclone.states import RunState
from cyclone.worker import Worker
from cyclone.workflow import StandaloneStep, Workflow


def _engine(url: str | None) -> Engine:
    url = url or os.environ.get("CYCLONE_DATABASE_URL")
    if not url:
        raise SystemExit("cyclone: give --url or set CYCLONE_DATABASE_URL")
    return create_engine(url)


def _definitions(
    modules: Sequence[str],
) -> tuple[list[Workflow[Any]], list[StandaloneStep[Any, Any]]]:
    workflows: list[Workflow[Any]] = []
    steps: list[StandaloneStep[Any, Any]] = []
    for name in modules:
        module = importlib.import_module(name)
        for value in vars(module).values():
            if isinstance(value, Workflow) and value not in workflows:
                workflows.append(value)
            elif isinstance(value, StandaloneStep) and value not in steps:
                steps.append(value)
    return workflows, steps


def _queues(specs: Sequence[str]) -> dict[str, int] | None:
    if not specs:
        return None
    queues: dict[str, int] = {}
    for spec in specs:
        queue, _, limit = spec.partition("=")
        queues[queue] = int(limit or 1)
    return queues


def _cmd_migrate(args: argparse.Namespace) -> int:
    if args.sql:
        from alembic import command

        config = migrations.alembic_config()
        command.upgrade(config, "head", sql=True)
        return 0
    engine = _engine(args.url)
    migrations.upgrade(engine)
    print(f"cyclone schema at {migrations.current_revision(engine)}")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    sys.path.insert(0, os.getcwd())
    workflows, steps = _definitions(args.modules)
    worker = Worker(
        _engine(args.url),
        workflows=workflows,
        steps=steps,
        concurrency=args.concurrency,
        queues=_queues(args.queue),
    )
    print(
        f"cyclone worker {worker.id}: workflows {sorted(worker.workflows)}, "
        f"steps {sorted(worker.steps)}, queues {worker.queues or 'all'}",
        flush=True,
    )
    if args.drain:
        print(f"ran {worker.drain()} jobs")
    else:
        worker.run()
    return 0


def _cmd_runs(args: argparse.Namespace) -> int:
    client = Client(_engine(args.url))
    state = RunState(args.state) if args.state else None
    for run in client.list_runs(workflow=args.workflow, state=state, limit=args.limit):
        error = f"  {run.error.get('message', '')}" if run.error else ""
        print(f"{run.id}  {run.workflow:<20} {run.state.value:<10} {run.key or '-'}{error}")
    return 0


def _cmd_purge(args: argparse.Namespace) -> int:
    client = Client(_engine(args.url))
    older_than = timedelta(days=args.older_than_days)
    runs = client.purge_terminal_runs(older_than=older_than)
    jobs = client.purge_finished_jobs(older_than=older_than)
    print(f"deleted {runs} runs and {jobs} standalone jobs")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cyclone`` command."""
    parser = argparse.ArgumentParser(prog="cyclone", description=__doc__)
    parser.add_argument("--url", help="database URL (default: $CYCLONE_DATABASE_URL)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    migrate = sub.add_parser("migrate", help="apply cyclone's schema revisions")
    migrate.add_argument("--sql", action="store_true", help="print the DDL instead of applying it")
    migrate.set_defaults(func=_cmd_migrate)

    worker = sub.add_parser("worker", help="run the workflows and steps defined in modules")
    worker.add_argument("modules", nargs="+", help="modules defining workflows and step kinds")
    worker.add_argument("-c", "--concurrency", type=int, default=4)
    worker.add_argument("-q", "--queue", action="append", default=[], metavar="NAME=LIMIT")
    worker.add_argument("--drain", action="store_true", help="run what is runnable now, then exit")
    worker.set_defaults(func=_cmd_worker)

    runs = sub.add_parser("runs", help="list runs, newest first")
    runs.add_argument("--workflow")
    runs.add_argument("--state", choices=[s.value for s in RunState])
    runs.add_argument("--limit", type=int, default=50)
    runs.set_defaults(func=_cmd_runs)

    purge = sub.add_parser("purge", help="delete terminal runs and finished jobs")
    purge.add_argument("--older-than-days", type=float, default=7.0)
    purge.set_defaults(func=_cmd_purge)

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    result: int = args.func(args)
    return result
