"""The commands of ``cyclone`` and :func:`build_cli`, the group Flask and Django mount."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from sqlalchemy import Engine

import cyclone
from cyclone import migrations
from cyclone.cli import _db, _definitions, _output
from cyclone.cli._db import EXIT_INTERRUPTED, EXIT_USAGE, BadInput, CommandError
from cyclone.client import Client
from cyclone.states import JobState, RunState
from cyclone.worker import Worker
from cyclone.workflow import StandaloneStep, Workflow

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
URL_ENV = "CYCLONE_DATABASE_URL"

EngineFactory = Callable[[], Engine]
DefinitionsFactory = Callable[
    [], tuple[Sequence[Workflow[Any]], Sequence[StandaloneStep[Any, Any]]]
]
WorkerOptions = Callable[[], Mapping[str, Any]]
F = TypeVar("F", bound=Callable[..., Any])

_KEY = "cyclone.cli"


@dataclass(frozen=True)
class _Host:
    """What the application mounting the group supplies (all optional)."""

    engine: EngineFactory | None = None
    definitions: DefinitionsFactory | None = None
    worker_options: WorkerOptions | None = None


@dataclass
class _Invocation:
    """One run of the command line: the options given and the Engine it opened."""

    url: str | None = None
    verbose: bool = False
    host: _Host = field(default_factory=_Host)
    command_path: str = "cyclone"
    opened: Engine | None = None
    schema_checked: bool = False

    def engine(self, *, schema: bool = True) -> Engine:
        """The database: ``--url``, else the host's engine, else ``$CYCLONE_DATABASE_URL``.

        The first call connects once, so an unreachable server is one clear error, and
        checks the schema unless ``schema`` is false.
        """
        if self.opened is None:
            ctx = click.get_current_context()
            url = self.url
            if url is None and self.host.engine is not None:
                engine = self.host.engine()
            else:
                url = url or os.environ.get(URL_ENV)
                if not url:
                    raise BadInput(f"no database given: pass --url URL or set {URL_ENV}")
                engine = _db.make_engine(url)
                ctx.find_root().call_on_close(engine.dispose)
            self.opened = engine
            _db.probe(engine)
        if schema and not self.schema_checked:
            _db.require_schema(self.opened, self.command_path)
            self.schema_checked = True
        return self.opened

    def client(self) -> Client:
        return Client(self.engine())


def _invocation(ctx: click.Context | None = None) -> _Invocation:
    ctx = ctx or click.get_current_context()
    found: _Invocation = ctx.meta.setdefault(_KEY, _Invocation())
    return found


def _set_url(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value is not None:
        _invocation(ctx).url = value


def _set_verbose(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        _invocation(ctx).verbose = True


def _common(f: F) -> F:
    """``--url`` and ``-v``, accepted before the subcommand and after it."""
    f = click.option(
        "--url",
        metavar="URL",
        expose_value=False,
        callback=_set_url,
        help=f"Database URL, e.g. postgresql://user@host:5432/db (default: ${URL_ENV}).",
    )(f)
    f = click.option(
        "-v",
        "--verbose",
        is_flag=True,
        expose_value=False,
        callback=_set_verbose,
        help="Show tracebacks of errors; log at DEBUG.",
    )(f)
    return f


def _json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")(
        f
    )


def _reported(f: F) -> F:
    """Turn whatever a command raises into a one-line CommandError (``-v``: with traceback)."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        inv = _invocation()
        try:
            return f(*args, **kwargs)
        except CommandError as exc:
            if inv.verbose:
                _db.print_cause(exc)
            raise
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if inv.verbose:
                _db.print_cause(exc)
            raise _db.translate(exc, inv.opened, inv.command_path) from exc

    return wrapper  # type: ignore[return-value]


def _command(group: click.Group, name: str, **settings: Any) -> Callable[[F], click.Command]:
    def decorate(f: F) -> click.Command:
        return group.command(name, **settings)(_common(_reported(f)))

    return decorate


# -- parameter types -------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration(value: str) -> timedelta:
    """``30s``, ``15m``, ``1h``, ``7d``, ``2w`` as a timedelta."""
    match = _DURATION.match(value)
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration such as 30s, 15m, 1h, 7d or 2w")
    return timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def since(value: str) -> datetime:
    """A duration back from now (``1h``) or an ISO 8601 time (UTC unless it says otherwise)."""
    if _DURATION.match(value):
        return datetime.now(UTC) - duration(value)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration (1h, 7d) nor an ISO 8601 time "
            "(2026-01-31T12:00:00+00:00)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _converted(
    convert: Callable[[str], Any],
) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        return None if value is None else convert(value)

    return callback


def _queue(value: str) -> tuple[str, int]:
    name, sep, limit = value.partition("=")
    if not name or (sep and not limit.isdigit()) or (sep and int(limit) < 1):
        raise click.BadParameter(f"{value!r}: write NAME or NAME=LIMIT (LIMIT a positive integer)")
    return name, int(limit) if sep else 1


# -- the group -------------------------------------------------------------------------


def build_cli(
    *,
    engine: EngineFactory | None = None,
    definitions: DefinitionsFactory | None = None,
    worker_options: WorkerOptions | None = None,
    name: str = "cyclone",
) -> click.Group:
    """The ``cyclone`` command group, for an application's own command line to mount.

    Args:
        engine: returns the application's Engine; without it the commands use ``--url``
            or ``$CYCLONE_DATABASE_URL``. ``--url`` still wins when given.
        definitions: returns ``(workflows, step kinds)`` that ``worker`` runs when no
            MODULE is named.
        worker_options: returns extra keyword arguments for :class:`cyclone.Worker`,
            e.g. ``{"step_context": app.app_context}``.
        name: the group's command name.

    Example:
        app.cli.add_command(build_cli(engine=lambda: db.engine), "cyclone")
    """
    host = _Host(engine, definitions, worker_options)

    @click.group(name=name, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(
        cyclone.__version__, "--version", prog_name="cyclone", message="%(prog)s %(version)s"
    )
    @_common
    @click.pass_context
    def group(ctx: click.Context) -> None:
        """Operate cyclone: migrate the schema, run workers, inspect and act on runs and jobs.

        The database comes from --url (before or after the command) or from
        $CYCLONE_DATABASE_URL. Exit status: 0 success, 1 error, 2 bad usage,
        3 database unreachable, 4 schema missing or old (run migrate).
        """
        inv = _invocation(ctx)
        inv.host = host
        inv.command_path = ctx.command_path

    _add_commands(group)
    return group


def _add_commands(group: click.Group) -> None:
    @_command(group, "migrate")
    @click.option("--sql", is_flag=True, help="Print the SQL instead of applying it (no database).")
    @click.option(
        "--from",
        "from_revision",
        metavar="REV",
        help="With --sql: only the revisions after REV (the database's current revision).",
    )
    def migrate(sql: bool, from_revision: str | None) -> None:
        """Apply cyclone's schema revisions (or print their SQL for review)."""
        if from_revision is not None and not sql:
            raise click.UsageError("--from goes with --sql (migrate finds the revision itself)")
        if sql:
            _print_upgrade_sql(from_revision)
            return
        inv = _invocation()
        engine = inv.engine(schema=False)
        before = migrations.current_revision(engine)
        migrations.upgrade(engine)
        after = migrations.current_revision(engine)
        if before == after:
            click.echo(f"cyclone schema already at {after}")
        else:
            click.echo(f"cyclone schema upgraded from {before or 'nothing'} to {after}")

    @_command(group, "check")
    def check() -> None:
        """Compare the database's schema revision with the one this version needs.

        Exit status 0 when they match, 4 when the schema is missing or old.
        """
        inv = _invocation()
        engine = inv.engine(schema=False)
        found = migrations.current_revision(engine)
        expected = migrations.head_revision()
        _output.fields([("found", found or "nothing"), ("expected", expected)])
        _db.require_schema(engine, inv.command_path)

    @_command(group, "worker")
    @click.argument("targets", nargs=-1, metavar="MODULE[:ATTR]...")
    @click.option(
        "-q",
        "--queue",
        "queues",
        multiple=True,
        metavar="NAME[=LIMIT]",
        help="Run only this queue, at most LIMIT jobs of it at once (repeatable).",
    )
    @click.option(
        "-c",
        "--concurrency",
        type=click.IntRange(min=1),
        help="Jobs run at once over all queues (threads).",
    )
    @click.option("--drain", is_flag=True, help="Run what is runnable now, then exit.")
    @click.option(
        "--grace",
        type=click.FloatRange(min=0),
        metavar="SECONDS",
        help="On SIGTERM/SIGINT, let running jobs finish this long, then hand them back.",
    )
    def worker(
        targets: tuple[str, ...],
        queues: tuple[str, ...],
        concurrency: int | None,
        drain: bool,
        grace: float | None,
    ) -> None:
        """Run the workflows and step kinds of MODULE (all it defines) or MODULE:ATTR.

        ATTR names one workflow, one step kind, or a list of them. Logs go to stderr
        at INFO (-v: DEBUG).
        """
        inv = _invocation()
        host = inv.host
        if targets:
            workflows, steps = _definitions.load(targets)
        elif host.definitions is not None:
            found_workflows, found_steps = host.definitions()
            workflows, steps = list(found_workflows), list(found_steps)
        else:
            raise click.UsageError("name at least one MODULE[:ATTR] holding workflows or steps")
        logging.basicConfig(level=logging.DEBUG if inv.verbose else logging.INFO, format=LOG_FORMAT)
        options: dict[str, Any] = dict(host.worker_options()) if host.worker_options else {}
        if concurrency is not None:
            options["concurrency"] = concurrency
        if queues:
            options["queues"] = dict(_queue(q) for q in queues)
        the_worker = Worker(inv.engine(), workflows=workflows, steps=steps, **options)
        logging.getLogger("cyclone.cli").info(
            "worker %s: workflows %s, step kinds %s, queues %s",
            the_worker.id,
            ", ".join(sorted(the_worker.workflows)) or "none",
            ", ".join(sorted(the_worker.steps)) or "none",
            ", ".join(the_worker.queues) if the_worker.queues else "all",
        )
        if drain:
            ran = the_worker.drain()
            click.echo(f"ran {ran} job{'' if ran == 1 else 's'}")
        elif grace is None:
            the_worker.run()
        else:
            run: Callable[..., None] = the_worker.run
            run(grace=grace)

    runs = click.Group("runs", help="List and inspect runs; cancel and retry them.")
    group.add_command(runs)

    @_command(runs, "list")
    @click.option("--workflow", help="Only runs of this workflow.")
    @click.option(
        "--state", type=click.Choice([s.value for s in RunState]), help="Only runs in this state."
    )
    @click.option("--key", help="Only the run with this submit key.")
    @click.option(
        "--since",
        callback=_converted(since),
        metavar="DURATION|TIME",
        help="Only runs created since: 1h, 7d or an ISO time.",
    )
    @click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
    @_json_option
    def runs_list(
        workflow: str | None,
        state: str | None,
        key: str | None,
        since: datetime | None,
        limit: int,
        as_json: bool,
    ) -> None:
        """List runs, newest first."""
        found = (
            _invocation()
            .client()
            .list_runs(workflow=workflow, state=state, key=key, since=since, limit=limit)
        )
        if as_json:
            for run in found:
                _output.json_line(_run_record(run))
            return
        _output.table(_RUN_COLUMNS, found)

    @_command(group, "purge")
    @click.option(
        "--older-than",
        callback=_converted(duration),
        metavar="DURATION",
        default="7d",
        show_default=True,
        help="Delete what ended longer ago than this (a run's own retention wins).",
    )
    @click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
    def purge(older_than: timedelta, dry_run: bool) -> None:
        """Delete finished runs (with their steps) and finished standalone jobs."""
        client = _invocation().client()
        if dry_run:
            runs_due, jobs_due = client.count_purgeable(older_than=older_than)
            click.echo(f"would delete {runs_due} runs and {jobs_due} standalone jobs")
            return
        runs_due, jobs_due = client.count_purgeable(older_than=older_than)
        with _output.progress("deleting runs", runs_due) as advance:
            deleted_runs = client.purge_terminal_runs(older_than=older_than, progress=advance)
        with _output.progress("deleting jobs", jobs_due) as advance:
            deleted_jobs = client.purge_finished_jobs(older_than=older_than, progress=advance)
        click.echo(f"deleted {deleted_runs} runs and {deleted_jobs} standalone jobs")


def _print_upgrade_sql(from_revision: str | None) -> None:
    from alembic.util import CommandError as AlembicError

    from alembic import command

    config = migrations.alembic_config()
    target = "head" if from_revision is None else f"{from_revision}:head"
    try:
        command.upgrade(config, target, sql=True)
    except AlembicError as exc:
        raise BadInput(f"cannot print the SQL from {from_revision!r}: {exc}") from exc


def _run_record(run: cyclone.RunStatus) -> dict[str, Any]:
    return {
        "id": str(run.id),
        "workflow": run.workflow,
        "key": run.key,
        "state": run.state.value,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "deadline": run.deadline,
        "failed_step": run.failed_step,
        "error": run.error,
    }


def _error_summary(error: Mapping[str, Any] | None) -> str:
    if not error:
        return ""
    text = f"{error.get('type', 'Error')}: {error.get('message', '')}"
    return text if len(text) <= 60 else f"{text[:59]}…"


_RUN_COLUMNS: list[_output.Column] = [
    ("ID", lambda r: str(r.id)),
    ("WORKFLOW", lambda r: r.workflow),
    ("KEY", lambda r: r.key or "-"),
    ("STATE", lambda r: r.state.value),
    ("CREATED (UTC)", lambda r: _output.when(r.created_at)),
    ("FINISHED (UTC)", lambda r: _output.when(r.finished_at)),
    ("ERROR", lambda r: _error_summary(r.error)),
]

_JOB_STATES = [s.value for s in JobState]

cli: click.Group = build_cli()


def run(argv: Sequence[str] | None = None) -> int:
    """Run :data:`cli` as the ``cyclone`` program; every error is one line on stderr."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        result = cli.main(args=args, prog_name="cyclone", standalone_mode=False)
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "cyclone"
        click.echo(f"cyclone: {exc.format_message()} (see '{where} --help')", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("cyclone: interrupted", err=True)
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else 0
