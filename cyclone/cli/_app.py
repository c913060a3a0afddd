"""The commands of ``cyclone`` and :func:`build_cli`, the group Flask and Django mount."""

from __future__ import annotations

import functools
import importlib
import logging
import math
import os
import re
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import click
from sqlalchemy import Engine

import cyclone
from cyclone import migrations
from cyclone._timing import MAX_DURATION
from cyclone.cli import _db, _definitions, _output
from cyclone.cli._db import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_USAGE, BadInput, CommandError
from cyclone.client import Client, JobDetail, QueueStatus, RunDetail, StepStatus, WorkerStatus
from cyclone.jobs import JobStatus
from cyclone.runs import Run
from cyclone.schedules import ScheduleStatus
from cyclone.states import JobState, Parked, RunState
from cyclone.worker import (
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_RESCUE_AFTER,
    MAX_CONCURRENCY,
    Worker,
)
from cyclone.workflow import StandaloneStep, Workflow

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
URL_ENV = "CYCLONE_DATABASE_URL"
CHILDREN_SHOWN = 20
"""Child runs `runs show` lists unless told otherwise (a map of children may have thousands)."""

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
                engine = _db.make_engine(url, ctx.command_path)
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


def _set_url(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        if not value.strip():
            # An empty --url (an unset shell variable) fell back to the environment's.
            raise click.BadParameter("is empty: give a database URL", ctx, param)
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
        help="Show the traceback behind an error; the worker logs cyclone's DEBUG lines.",
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
        except BrokenPipeError:
            # click's main would turn it into exit status 1, also when Flask or Django
            # mount these commands: an Exit keeps the documented 141 everywhere.
            raise click.exceptions.Exit(_reader_gone()) from None
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
    """``30s``, ``15m``, ``1h``, ``7d``, ``2w`` as a timedelta, at most 1,000 years (a
    longer one overflowed: ``runs list --since 99999999d`` ended in a traceback)."""
    match = _DURATION.match(value)
    if not match:
        raise click.BadParameter(f"{value!r} is not a duration such as 30s, 15m, 1h, 7d or 2w")
    seconds = float(match[1]) * _UNITS[match[2]]
    if seconds > MAX_DURATION.total_seconds():
        raise click.BadParameter(f"{value!r} is longer than 1,000 years")
    return timedelta(seconds=seconds)


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


class _Seconds(click.FloatRange):
    """A number of seconds in a range; ``nan`` passes every bound of a FloatRange, so it is
    refused here (``worker --grace nan`` was taken, ``--heartbeat nan`` failed as status 1)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


def _converted(
    convert: Callable[[str], Any],
) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        return None if value is None else convert(value)

    return callback


def _queue(value: str) -> tuple[str, int]:
    name, sep, limit = value.partition("=")
    # ASCII digits, and few: str.isdigit() takes '²', which int() refuses, and int()
    # refuses more than 4,300 digits; either was a ValueError, status 1.
    counted = re.fullmatch(r"[0-9]{1,9}", limit) is not None
    if not name or (sep and not (counted and 1 <= int(limit) <= MAX_CONCURRENCY)):
        raise click.BadParameter(
            f"{value!r}: write NAME or NAME=LIMIT (LIMIT an integer from 1 to {MAX_CONCURRENCY:,})"
        )
    return name, int(limit) if sep else 1


def _queue_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A queue's NAME; an empty one is bad usage (status 2), said before any statement.

    ``Client.pause_queue`` refuses it with a ValueError, which the command line reported as
    a failed operation ("cyclone: ValueError: ...", status 1).
    """
    if not value:
        raise click.BadParameter("a queue name is a non-empty string")
    return value


def _after_option(item: str) -> Callable[[F], F]:
    return click.option(
        "--after",
        metavar="CURSOR",
        help=f"Start after this {item}: the cursor a previous page printed.",
    )


Listed = TypeVar("Listed", cyclone.RunStatus, cyclone.JobStatus)


def _paged(read: Callable[[], list[Listed]]) -> list[Listed]:
    """A listing's page; a cursor that is not one is bad input, said in one line."""
    try:
        return read()
    except ValueError as exc:
        # The cursor's error says "after=..."; another (a --limit past PostgreSQL's
        # integer, a --key that is no UTF-8) names its own option and is not --after's.
        message = str(exc)
        raise BadInput(f"--after: {message}" if message.startswith("after=") else message) from None


def _print_page(
    found: list[Listed],
    limit: int,
    as_json: bool,
    columns: Sequence[_output.Column],
    record: Callable[[Listed], dict[str, Any]],
) -> None:
    """Print the first ``limit`` of ``found`` (read with one more, to know if more follow),
    then, if more do, the next page's cursor on stderr."""
    page = found[:limit]
    if as_json:
        for item in page:
            _output.json_line({**record(item), "cursor": item.cursor})
    else:
        _output.table(columns, page)
    if len(found) > limit:
        click.echo(f"more: --after {page[-1].cursor}", err=True)


# -- the group -------------------------------------------------------------------------


def build_cli(
    *,
    engine: EngineFactory | None = None,
    definitions: DefinitionsFactory | None = None,
    worker_options: WorkerOptions | None = None,
    name: str = "cyclone",
    database: str | None = None,
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
        database: where the host's database comes from, for ``--help`` (e.g. "the Flask
            app's configuration: ..."); given with ``engine``, the help of the group and
            of ``--url`` say the database is that one, and ``--url`` overrides it.

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
        inv = _invocation(ctx)
        inv.host = host
        inv.command_path = ctx.command_path

    group.help = _group_help(
        f"The database comes from --url (before or after the command) or from ${URL_ENV}."
    )
    _add_commands(group)
    if database is not None:
        _say_where_the_database_is(group, database)
    return group


def _say_where_the_database_is(group: click.Group, database: str) -> None:
    """Rewrite the help of ``group`` and of every ``--url`` for a host's own database."""
    group.help = _group_help(
        f"The database is {database}; --url URL (before or after the command) overrides it."
    )
    stack: list[click.Command] = [group]
    while stack:
        command = stack.pop()
        for param in command.params:
            if isinstance(param, click.Option) and param.name == "url":
                param.help = "Use this database instead of the application's."
        if isinstance(command, click.Group):
            stack.extend(command.commands.values())


def _group_help(database: str) -> str:
    return (
        "Operate cyclone: migrate the schema, run workers, inspect and act on runs and jobs.\n\n"
        f"{database} Exit status: 0 success, 1 error, 2 bad usage, 3 database unreachable, "
        "4 schema missing or old (run migrate)."
    )


def _add_commands(group: click.Group) -> None:
    @_command(group, "migrate", short_help="Apply cyclone's schema revisions, or print their SQL.")
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
        _db.refuse_shared(engine, inv.command_path)
        before = migrations.current_revision(engine)
        migrations.upgrade(engine)
        after = migrations.current_revision(engine)
        if before == after:
            click.echo(f"cyclone schema already at {after}")
        else:
            click.echo(f"cyclone schema upgraded from {before or 'nothing'} to {after}")

    @_command(group, "check", short_help="Show the schema revision found and expected.")
    def check() -> None:
        """Compare the database's schema revision with the one this version needs.

        Also names the mode: cyclone's own version table, or cyclone's revisions in the
        application's alembic history. Exit status 0 when the revisions match, 4 when the
        schema is missing or old (the line on stderr names the command of the mode).
        """
        inv = _invocation()
        engine = inv.engine(schema=False)
        found = migrations.find(engine)
        expected = migrations.head_revision()
        mode = {
            "own": f"{migrations.OWN_MODE} ({migrations.VERSION_TABLE})",
            "shared": f"{migrations.SHARED_MODE} ({migrations.SHARED_VERSION_TABLE})",
            "none": "unknown" if found.maybe_shared else "none",
        }[found.mode]
        _output.fields(
            [("found", found.revision or "nothing"), ("mode", mode), ("expected", expected)]
        )
        _db.require_schema(engine, inv.command_path)

    @_command(group, "worker", short_help="Run workflows and step kinds from Python modules.")
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
        type=click.IntRange(min=1, max=MAX_CONCURRENCY),
        metavar="N",
        help=f"Jobs run at once over all queues (threads; default 4, at most {MAX_CONCURRENCY:,}).",
    )
    @click.option("--drain", is_flag=True, help="Run what is runnable now, then exit.")
    @click.option(
        "--grace",
        type=_Seconds(min=0),
        metavar="SECONDS",
        help="On SIGTERM/SIGINT, let running jobs finish this long, then hand them back.",
    )
    @click.option(
        "--heartbeat",
        type=_Seconds(min=0, min_open=True, max=86400),
        metavar="SECONDS",
        help="Beat for the running jobs this often (default 5).",
    )
    @click.option(
        "--rescue-after",
        type=_Seconds(min=0, min_open=True, max=86400),
        metavar="SECONDS",
        help="Run again the jobs of a worker silent this long (default 60; above --heartbeat).",
    )
    def worker(
        targets: tuple[str, ...],
        queues: tuple[str, ...],
        concurrency: int | None,
        drain: bool,
        grace: float | None,
        heartbeat: float | None,
        rescue_after: float | None,
    ) -> None:
        """Run the workflows and step kinds of MODULE (all it defines) or MODULE:ATTR.

        ATTR names one workflow, one step kind, or a list of them. Logs go to stderr
        at INFO (-v: cyclone's own loggers at DEBUG).
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
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        if inv.verbose:
            logging.getLogger("cyclone").setLevel(logging.DEBUG)
        options: dict[str, Any] = dict(host.worker_options()) if host.worker_options else {}
        if concurrency is not None:
            options["concurrency"] = concurrency
        if queues:
            options["queues"] = dict(_queue(q) for q in queues)
        if heartbeat is not None:
            options["heartbeat_interval"] = timedelta(seconds=heartbeat)
        if rescue_after is not None:
            options["rescue_after"] = timedelta(seconds=rescue_after)
        beat = options.get("heartbeat_interval", DEFAULT_HEARTBEAT_INTERVAL)
        silent = options.get("rescue_after", DEFAULT_RESCUE_AFTER)
        if beat >= silent:
            raise BadInput(
                f"--heartbeat ({beat.total_seconds():g}s) must be less than --rescue-after "
                f"({silent.total_seconds():g}s): live jobs would be rescued and run twice"
            )
        engine = inv.engine(schema=False)
        _db.require_schema(engine, inv.command_path, allow_newer=True)
        with Worker(engine, workflows=workflows, steps=steps, **options) as the_worker:
            logging.getLogger("cyclone.cli").info(
                "worker %s: workflows %s, step kinds %s, queues %s",
                the_worker.id,
                ", ".join(sorted(the_worker.workflows)) or "none",
                ", ".join(sorted(the_worker.steps)) or "none",
                ", ".join(the_worker.queues) if the_worker.queues else "all",
            )
            if drain:
                ran = the_worker.drain()
                stats = the_worker.stats
                click.echo(
                    f"ran {ran} job{'' if ran == 1 else 's'}: {stats.completed} completed, "
                    f"{stats.retried} retried, {stats.failed} failed"
                )
            else:
                the_worker.run(grace=grace)

    runs = click.Group("runs", help="List and inspect runs; cancel and retry them, one or all.")
    group.add_command(runs)

    @_command(runs, "list")
    @click.option("--workflow", help="Only runs of this workflow.")
    @click.option(
        "--state", type=click.Choice([s.value for s in RunState]), help="Only runs in this state."
    )
    @click.option("--key", help="Only the run with this submit key.")
    @click.option(
        "--parked",
        type=click.Choice([p.value for p in Parked]),
        help="Only running runs parked so: waiting for a signal, sleeping, delayed.",
    )
    @click.option(
        "--since",
        callback=_converted(since),
        metavar="DURATION|TIME",
        help="Only runs created since: 1h, 7d or an ISO time.",
    )
    @click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
    @_after_option("run")
    @_json_option
    def runs_list(
        workflow: str | None,
        state: str | None,
        key: str | None,
        parked: str | None,
        since: datetime | None,
        limit: int,
        after: str | None,
        as_json: bool,
    ) -> None:
        """List runs, newest first, a page of --limit at a time.

        PARKED says why a running run waits with no step running or due: waiting (for a
        signal), sleeping, delayed (until its start). When more runs follow, the next page's
        cursor is printed on stderr (and each --json line carries its run's "cursor"): pass
        it to --after for the next page.
        """
        client = _invocation().client()
        found = _paged(
            lambda: client.list_runs(
                workflow=workflow,
                state=state,
                key=key,
                since=since,
                limit=limit + 1,
                after=after,
                parked=parked,
            )
        )
        _print_page(found, limit, as_json, _RUN_COLUMNS, _run_record)

    @_command(runs, "show", short_help="Show a run: input, result, steps and errors.")
    @click.argument("run_id", required=False, metavar="[RUN_ID]")
    @click.option("--workflow", help="With --key: the run of this workflow...")
    @click.option("--key", help="...with this submit key.")
    @click.option(
        "--children",
        type=click.IntRange(min=0),
        default=None,
        help=f"List at most this many child runs (default {CHILDREN_SHOWN}; with --json, all).",
    )
    @_json_option
    def runs_show(
        run_id: str | None,
        workflow: str | None,
        key: str | None,
        children: int | None,
        as_json: bool,
    ) -> None:
        """Show one run: input, result, and each step's state, attempts, timing and errors.

        Name the run by RUN_ID, or by --workflow and --key. Its child runs are listed in
        item order, the first --children of them; the count of the others follows.
        """
        client = _invocation().client()
        if children is None and not as_json:
            children = CHILDREN_SHOWN
        detail = client.get_run_detail(
            _find_run(client, run_id, workflow, key), children_limit=children
        )
        if detail is None:
            raise CommandError(f"run {run_id} does not exist")
        if as_json:
            _output.json_line(_run_detail_record(detail))
        else:
            _print_run_detail(detail)

    def _act(name: str, verb: str, done: str, bulk: _Bulk | None = None) -> None:
        @_command(runs, name)
        @click.argument(
            "run_id", required=bulk is None, metavar="RUN_ID" if bulk is None else "[RUN_ID]"
        )
        def act(run_id: str | None, **options: Any) -> None:
            if bulk is not None and (options["every"] or run_id is None):
                _act_in_bulk(bulk, run_id, options)
                return
            assert run_id is not None
            _refuse_filters(options)
            client = _invocation().client()
            status = client.get_run(_run_uuid(run_id))
            if status is None:
                raise CommandError(f"run {run_id} does not exist")
            handle = Run(client.engine, status.id, status.workflow, status.key)
            getattr(handle, name.replace("-", "_"))()
            click.echo(f"{done} run {status.id} of workflow {status.workflow}")

        act.help = verb
        if bulk is not None:
            at = next(i for i, p in enumerate(act.params) if p.name == "run_id") + 1
            act.params[at:at] = _bulk_options(bulk)

    _act(
        "cancel",
        "Cancel a running run (steps not yet started never start), or with --all every "
        "running run the filters list.",
        "cancelled",
        _CANCEL,
    )
    _act(
        "retry",
        "Run a failed or cancelled run's unfinished steps again, or with --all those of "
        "every failed and cancelled run the filters list.",
        "retrying",
        _RETRY,
    )
    _act("retry-all", "Run every step of a finished run again, from the roots.", "retrying")

    @_command(runs, "fork", short_help="Fork a finished run onto the current definition.")
    @click.argument("run_id", metavar="RUN_ID")
    @click.option("--key", required=True, help="The fork's submit key (a second fork returns it).")
    @click.option(
        "--rerun",
        "rerun",
        multiple=True,
        metavar="STEP",
        help="Run this step and those downstream of it again (repeatable).",
    )
    @click.option(
        "--app",
        "targets",
        multiple=True,
        metavar="MODULE[:ATTR]",
        help="Where the current definition of the run's workflow is (repeatable).",
    )
    def runs_fork(run_id: str, key: str, rerun: tuple[str, ...], targets: tuple[str, ...]) -> None:
        """Make a new run of the workflow's current definition with RUN_ID's input.

        Steps RUN_ID completed keep their outputs unless named with --rerun or
        downstream of one that is; the others run on the current code. The definition
        comes from --app MODULE[:ATTR] (as for cyclone worker), or from the
        application that mounts these commands.
        """
        inv = _invocation()
        client = inv.client()
        status = client.get_run(_run_uuid(run_id))
        if status is None:
            raise CommandError(f"run {run_id} does not exist")
        if targets:
            workflows, _steps = _definitions.load(targets)
        elif inv.host.definitions is not None:
            workflows = list(inv.host.definitions()[0])
        else:
            raise click.UsageError(
                f"name the module defining workflow {status.workflow!r} with --app MODULE[:ATTR]"
            )
        definition = next((wf for wf in workflows if wf.name == status.workflow), None)
        if definition is None:
            raise BadInput(f"no workflow {status.workflow!r} is defined by {', '.join(targets)}")
        fork, created = definition.run(client.engine, status.id).fork(key, rerun=rerun)
        made = "forked" if created else "already forked"
        click.echo(f"{made} run {status.id} of workflow {status.workflow} as run {fork.id}")

    jobs = click.Group("jobs", help="List and inspect standalone jobs; cancel and retry them.")
    group.add_command(jobs)

    @_command(jobs, "list")
    @click.option("--queue", help="Only jobs of this queue.")
    @click.option("--kind", help="Only jobs of this step kind.")
    @click.option("--state", type=click.Choice(_JOB_STATES), help="Only jobs in this state.")
    @click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
    @_after_option("job")
    @_json_option
    def jobs_list(
        queue: str | None,
        kind: str | None,
        state: str | None,
        limit: int,
        after: str | None,
        as_json: bool,
    ) -> None:
        """List standalone jobs, newest first, a page of --limit at a time.

        When more jobs follow, the next page's cursor is printed on stderr (and each
        --json line carries its job's "cursor"): pass it to --after for the next page.
        """
        client = _invocation().client()
        found = _paged(
            lambda: client.list_jobs(
                queue=queue, kind=kind, state=state, limit=limit + 1, after=after
            )
        )
        _print_page(found, limit, as_json, _JOB_COLUMNS, _job_record)

    @_command(jobs, "show")
    @click.argument("job_id", type=int, metavar="JOB_ID")
    @_json_option
    def jobs_show(job_id: int, as_json: bool) -> None:
        """Show one job: arguments, output, attempts and errors.

        A standalone job, or the job of a step of a run (the job ids that worker logs
        and runs show --json give): then its run, workflow and step are named.
        """
        detail = _invocation().client().get_job_detail(job_id)
        if detail is None:
            raise CommandError(f"job {job_id} does not exist")
        if as_json:
            _output.json_line(_job_detail_record(detail))
        else:
            _print_job_detail(detail)

    @_command(jobs, "retry")
    @click.argument("job_id", type=int, metavar="JOB_ID")
    def jobs_retry(job_id: int) -> None:
        """Run a failed or cancelled standalone job again, from its first attempt."""
        _invocation().client().retry_job(job_id)
        click.echo(f"retrying job {job_id}")

    @_command(jobs, "cancel")
    @click.argument("job_id", type=int, metavar="JOB_ID")
    def jobs_cancel(job_id: int) -> None:
        """Cancel a standalone job that has not started."""
        _invocation().client().cancel_job(job_id)
        click.echo(f"cancelled job {job_id}")

    schedules = click.Group(
        "schedules", help="List the schedules workers registered; pause and resume them."
    )
    group.add_command(schedules)

    @_command(schedules, "list")
    @_json_option
    def schedules_list(as_json: bool) -> None:
        """List the schedules registered by workers, by name, with their last and next tick."""
        _listed(
            _invocation().client().list_schedules(), _schedule_record, _SCHEDULE_COLUMNS, as_json
        )

    @_command(schedules, "pause")
    @click.argument("name", metavar="NAME")
    def schedules_pause(name: str) -> None:
        """Stop firing schedule NAME; the ticks that fall while it is paused never fire."""
        try:
            changed = _invocation().client().pause_schedule(name)
        except ValueError as exc:  # a name that is no UTF-8 (argv's bytes): bad input
            raise BadInput(f"NAME: {exc}") from None
        click.echo(f"paused schedule {name}" if changed else f"schedule {name} was paused already")

    @_command(schedules, "resume")
    @click.argument("name", metavar="NAME")
    def schedules_resume(name: str) -> None:
        """Fire schedule NAME again, from its next tick on."""
        try:
            changed = _invocation().client().resume_schedule(name)
        except ValueError as exc:  # a name that is no UTF-8 (argv's bytes): bad input
            raise BadInput(f"NAME: {exc}") from None
        click.echo(f"resumed schedule {name}" if changed else f"schedule {name} was not paused")

    queues = click.Group(
        "queues", help="List queues with their active jobs; pause and resume them."
    )
    group.add_command(queues)

    @_command(queues, "list")
    @_json_option
    def queues_list(as_json: bool) -> None:
        """List the queues with active jobs or ever paused: paused or not, and their jobs."""
        _listed(_invocation().client().list_queues(), _queue_record, _QUEUE_COLUMNS, as_json)

    @_command(queues, "pause")
    @click.argument("name", metavar="NAME", callback=_queue_name)
    def queues_pause(name: str) -> None:
        """Stop claiming the jobs of queue NAME (running ones finish) until it is resumed."""
        changed = _invocation().client().pause_queue(name)
        click.echo(f"paused queue {name}" if changed else f"queue {name} was paused already")

    @_command(queues, "resume")
    @click.argument("name", metavar="NAME", callback=_queue_name)
    def queues_resume(name: str) -> None:
        """Claim the jobs of queue NAME again; idle workers are woken at once."""
        changed = _invocation().client().resume_queue(name)
        click.echo(f"resumed queue {name}" if changed else f"queue {name} was not paused")

    @_command(group, "workers", short_help="List the running workers.")
    @_json_option
    def workers(as_json: bool) -> None:
        """List the running workers, oldest first: what they serve, their last heartbeat,
        the jobs running under each, and whether it is stopping."""
        _listed(_invocation().client().list_workers(), _worker_record, _WORKER_COLUMNS, as_json)

    limits_group = click.Group(
        "limits", help="List the named limits (Concurrency, Rate) per key; set their max."
    )
    group.add_command(limits_group)

    @_command(limits_group, "list")
    @_json_option
    def limits_list(as_json: bool) -> None:
        """List every limit with, per key, how many run and how many wait."""
        for limit in _invocation().client().list_limits():
            per = None if limit.per is None else limit.per.total_seconds()
            if as_json:
                _output.json_line(
                    {
                        "name": limit.name,
                        "max": limit.max,
                        "per_seconds": per,
                        "counts": limit.counts,
                        "set_by_operator": limit.set_by_operator,
                        "keys": {
                            k: {"running": r, "waiting": w} for k, (r, w) in limit.keys.items()
                        },
                    }
                )
                continue
            what = f"max {limit.max}" + ("" if per is None else f" per {per:g}s")
            set_by = " (set by an operator)" if limit.set_by_operator else ""
            click.echo(f"{limit.name}: {what} {limit.counts}{set_by}")
            for key, (running, waiting) in sorted(limit.keys.items()):
                click.echo(f"  {key or '(all)'}: {running} running, {waiting} waiting")

    @_command(limits_group, "set")
    @click.argument("name", metavar="NAME")
    @click.argument("maximum", metavar="MAX", type=click.IntRange(0))
    def limits_set(name: str, maximum: int) -> None:
        """Set limit NAME's max; workers apply it within a second, over the definitions'."""
        try:
            _invocation().client().set_limit(name, maximum)
        except ValueError as exc:  # bad input, not a database error
            # The name's error (no UTF-8: argv's bytes) says "name=..."; the other is MAX's
            # (past the column's range).
            message = str(exc)
            raise BadInput(
                f"NAME: {message}" if message.startswith("name=") else f"MAX: {message}"
            ) from None
        click.echo(f"limit {name}: max {maximum}")

    @_command(group, "dashboard")
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
    @click.option("--port", type=click.IntRange(0, 65535), default=8421, show_default=True)
    @click.option(
        "--threads",
        type=click.IntRange(1),
        default=4,
        show_default=True,
        help="Requests served at once.",
    )
    def dashboard(host: str, port: int, threads: int) -> None:
        """Serve the web dashboard with waitress until SIGINT or SIGTERM (dashboard extra)."""
        try:
            web = importlib.import_module("cyclone.dashboard")
            importlib.import_module("waitress")
        except ModuleNotFoundError as exc:
            raise CommandError(
                f"the dashboard needs the dashboard extra (no module {exc.name}): "
                "pip install 'cyclone[dashboard]'"
            ) from exc
        if not host.strip():
            raise click.BadParameter("is empty: give an address to listen on", param_hint="--host")
        engine = _invocation().engine()
        try:
            web.serve(
                engine,
                host=host,
                port=port,
                threads=threads,
                ready=lambda url: click.echo(f"cyclone dashboard on {url}", err=True),
            )
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise CommandError(f"cannot listen on {host}:{port}: {reason}") from exc
        click.echo("cyclone dashboard stopped", err=True)

    @_command(group, "purge", short_help="Delete finished runs and standalone jobs.")
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
            click.echo(f"would delete {_runs(runs_due)} and {_standalone_jobs(jobs_due)}")
            return
        runs_due, jobs_due = client.count_purgeable(older_than=older_than)
        with _output.progress("deleting runs", runs_due) as advance:
            deleted_runs = client.purge_terminal_runs(older_than=older_than, progress=advance)
        with _output.progress("deleting jobs", jobs_due) as advance:
            deleted_jobs = client.purge_finished_jobs(older_than=older_than, progress=advance)
        click.echo(f"deleted {_runs(deleted_runs)} and {_standalone_jobs(deleted_jobs)}")


@dataclass(frozen=True)
class _Bulk:
    """A run action that also acts in bulk: its verbs, and the run states it starts from."""

    verb: str
    done: str
    sources: tuple[RunState, ...]
    method: str


_CANCEL = _Bulk("cancel", "cancelled", (RunState.RUNNING,), "cancel_runs")
_RETRY = _Bulk("retry", "retried", (RunState.FAILED, RunState.CANCELLED), "retry_runs")
_FILTERS = ("workflow", "state", "key", "since", "until")


def _bulk_options(bulk: _Bulk) -> list[click.Option]:
    states = " or ".join(s.value for s in bulk.sources)
    return [
        click.Option(
            ["--all", "every"],
            is_flag=True,
            help=f"Every {states} run the filters list (no RUN_ID).",
        ),
        click.Option(["--workflow"], help="With --all: only runs of this workflow."),
        click.Option(
            ["--state"],
            type=click.Choice([s.value for s in bulk.sources]),
            help="With --all: only runs in this state.",
        ),
        click.Option(["--key"], help="With --all: only the run with this submit key."),
        click.Option(
            ["--since"],
            callback=_converted(since),
            metavar="DURATION|TIME",
            help="With --all: only runs created since: 1h, 7d or an ISO time.",
        ),
        click.Option(
            ["--until"],
            callback=_converted(since),
            metavar="DURATION|TIME",
            help="With --all: only runs created before: 1h (ago) or an ISO time.",
        ),
        click.Option(
            ["--dry-run"], is_flag=True, help="With --all: count the runs; change nothing."
        ),
        click.Option(["-y", "--yes"], is_flag=True, help="With --all: do not ask to confirm."),
    ]


def _refuse_filters(options: Mapping[str, Any]) -> None:
    given = [f"--{n.replace('_', '-')}" for n in (*_FILTERS, "dry_run", "yes") if options.get(n)]
    if given:
        verb = "goes" if len(given) == 1 else "go"
        raise click.UsageError(f"{', '.join(given)} {verb} with --all, not with a RUN_ID")


def _described(options: Mapping[str, Any]) -> str:
    parts = []
    for name in _FILTERS:
        value = options.get(name)
        if value is None:
            continue
        shown = _output.when(value) if isinstance(value, datetime) else str(value)
        parts.append(f"{name} {shown}")
    return f" ({', '.join(parts)})" if parts else ""


def _runs(count: int) -> str:
    return f"{count:,} run{'' if count == 1 else 's'}"


def _standalone_jobs(count: int) -> str:
    return f"{count:,} standalone job{'' if count == 1 else 's'}"


def _act_in_bulk(bulk: _Bulk, run_id: str | None, options: Mapping[str, Any]) -> None:
    """``runs cancel --all`` / ``runs retry --all``: count, confirm, then act in batches."""
    if run_id is not None:
        raise click.UsageError("give RUN_ID or --all with filters, not both")
    if not options["every"]:
        raise click.UsageError("give RUN_ID, or --all to act on every run the filters list")
    filters = {name: options[name] for name in _FILTERS}
    start, end = filters["since"], filters["until"]
    if start is not None and end is not None and start >= end:
        raise click.UsageError(
            f"--since ({_output.when(start)}) is not before --until ({_output.when(end)}): "
            "no run was created in between"
        )
    client = _invocation().client()
    act: Callable[..., int] = getattr(client, bulk.method)
    states = " or ".join(s.value for s in bulk.sources)
    count = act(**filters, dry_run=True)
    where = _described(filters)
    if options["dry_run"]:
        click.echo(f"would {bulk.verb} {_runs(count)}{where}")
        return
    if count == 0:
        click.echo(f"no {states} runs match{where}: nothing to {bulk.verb}")
        return
    if not options["yes"]:
        question = f"{bulk.verb.capitalize()} {_runs(count)} ({states}){where}?"
        if not sys.stdin.isatty():
            raise BadInput(f"{question} Pass --yes to confirm (stdin is not a terminal)")
        if not click.confirm(question, default=False):
            raise CommandError("nothing changed")
    with _output.progress(f"{bulk.done} runs", count) as advance:
        changed = act(**filters, progress=advance)
    skipped = count - changed
    note = f" ({_runs(skipped)} skipped: changed meanwhile, or refused)" if skipped > 0 else ""
    click.echo(f"{bulk.done} {_runs(changed)}{note}")


Item = TypeVar("Item")


def _listed(
    found: Sequence[Item],
    record: Callable[[Item], dict[str, Any]],
    columns: list[_output.Column],
    as_json: bool,
) -> None:
    """A listing with no paging: a JSON line per item, or a table."""
    if as_json:
        for item in found:
            _output.json_line(record(item))
        return
    _output.table(columns, found, state=None)


def _queue_record(queue: QueueStatus) -> dict[str, Any]:
    return {
        "name": queue.name,
        "paused": queue.paused,
        "paused_at": queue.paused_at,
        "available": queue.available,
        "scheduled": queue.scheduled,
        "running": queue.running,
    }


_QUEUE_COLUMNS: list[_output.Column] = [
    ("QUEUE", lambda q: q.name),
    ("PAUSED", lambda q: f"since {_output.when(q.paused_at)}" if q.paused else "no"),
    ("AVAILABLE", lambda q: str(q.available)),
    ("SCHEDULED", lambda q: str(q.scheduled)),
    ("RUNNING", lambda q: str(q.running)),
]


def _worker_record(worker: WorkerStatus) -> dict[str, Any]:
    return {
        "id": worker.id,
        "host": worker.host,
        "pid": worker.pid,
        "started_at": worker.started_at,
        "heartbeat_at": worker.heartbeat_at,
        "concurrency": worker.concurrency,
        "queues": worker.queues,
        "workflows": worker.workflows,
        "steps": worker.steps,
        "version": worker.version,
        "stopping_at": worker.stopping_at,
        "running": worker.running,
        "rescue_after": None
        if worker.rescue_after is None
        else worker.rescue_after.total_seconds(),
    }


def _names(names: Sequence[str] | None, none: str = "-") -> str:
    return ",".join(names) if names else none


_WORKER_COLUMNS: list[_output.Column] = [
    ("ID", lambda w: w.id),
    ("STARTED (UTC)", lambda w: _output.when(w.started_at)),
    ("HEARTBEAT (UTC)", lambda w: _output.when(w.heartbeat_at)),
    ("RUNNING", lambda w: f"{w.running}/{w.concurrency}"),
    ("QUEUES", lambda w: _names(w.queues, "all")),
    ("WORKFLOWS", lambda w: _names(w.workflows)),
    ("STEPS", lambda w: _names(w.steps)),
    ("VERSION", lambda w: w.version),
    ("STOPPING (UTC)", lambda w: _output.when(w.stopping_at)),
]


def _print_upgrade_sql(from_revision: str | None) -> None:
    try:
        sql = migrations.upgrade_sql(from_revision)
    except cyclone.SchemaError as exc:
        raise BadInput(f"cannot print the SQL from {from_revision!r}: {exc}") from exc
    click.echo(sql, nl=False)


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
        "retention": run.retention,
        "parked": None if run.parked is None else run.parked.value,
        "forked_from": None if run.forked_from is None else str(run.forked_from),
        "parent_id": None if run.parent_id is None else str(run.parent_id),
        "parent_node": run.parent_node,
        "parent_item": run.parent_item,
    }


def _item(run: cyclone.RunStatus) -> str:
    """`` item N`` for a child of a map of children's item N, else nothing."""
    return "" if run.parent_item is None else f" item {run.parent_item}"


def _error_summary(error: Mapping[str, Any] | None, width: int = 60) -> str:
    if not error:
        return ""
    text = " ".join(f"{error.get('type', 'Error')}: {error.get('message', '')}".split())
    return text if len(text) <= width else f"{text[: width - 1]}…"


def _run_uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadInput(f"{value!r} is not a run id (a UUID)") from None


def _find_run(
    client: Client, run_id: str | None, workflow: str | None, key: str | None
) -> uuid.UUID:
    if run_id is not None:
        if workflow is not None or key is not None:
            raise click.UsageError("give RUN_ID or --workflow with --key, not both")
        return _run_uuid(run_id)
    if workflow is None or key is None:
        raise click.UsageError("give RUN_ID, or --workflow and --key")
    found = client.list_runs(workflow=workflow, key=key, limit=1)
    if not found:
        raise CommandError(f"workflow {workflow!r} has no run with key {key!r}")
    return found[0].id


def _step_record(step: StepStatus) -> dict[str, Any]:
    return {
        "name": step.name,
        "job_id": step.job_id,
        "state": step.state.value,
        "queue": step.queue,
        "attempt": step.attempt,
        "max_attempts": step.max_attempts,
        "scheduled_at": step.scheduled_at,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "duration": step.duration,
        "errors": step.errors,
        "output": step.output,
        "worker_id": step.worker_id,
        "waiting_for": step.waiting_for,
        "wakes_at": step.wakes_at,
        "parked": None if step.parked is None else step.parked.value,
        "items_done": step.items_done,
        "items_total": step.items_total,
        "running_for": step.running_for,
    }


def _run_detail_record(detail: RunDetail) -> dict[str, Any]:
    return {
        **_run_record(detail.status),
        "input": detail.input,
        "result_step": detail.result_step,
        "result": detail.result,
        "steps": [_step_record(step) for step in detail.steps],
        "children": [_run_record(child) for child in detail.children],
        "children_total": detail.children_total,
    }


def _print_errors(errors: Sequence[Mapping[str, Any]], title: str) -> None:
    for error in errors:
        _output.heading(
            f"{title}, attempt {error.get('attempt', '?')} at {error.get('at', '?')}: "
            f"{error.get('type', 'Error')}: {error.get('message', '')}"
        )
        if error.get("traceback"):
            _output.block(str(error["traceback"]))


def _print_run_detail(detail: RunDetail) -> None:
    run = detail.status
    pairs = [
        ("run", str(run.id)),
        ("workflow", run.workflow),
        ("key", run.key or "-"),
        ("state", run.state.value),
        *([("parked", _run_parked(detail))] if run.parked is not None else []),
        ("created", _output.when(run.created_at)),
        ("finished", _output.when(run.finished_at)),
        ("deadline", _output.when(run.deadline)),
        ("retention", _output.duration(run.retention) if run.retention else "default"),
    ]
    if run.forked_from is not None:
        pairs.append(("forked from", str(run.forked_from)))
    if run.parent_id is not None:
        pairs.append(("parent", f"{run.parent_id} (node {run.parent_node}{_item(run)})"))
    for child in detail.children:
        node = f"node {child.parent_node}{_item(child)}"
        pairs.append(("child", f"{child.id} {child.workflow} {child.state.value} ({node})"))
    if detail.children_total > len(detail.children):
        more = detail.children_total - len(detail.children)
        pairs.append(("child", f"and {more} more, not listed (--children N lists N)"))
    if run.error:
        item = f" item {run.error['item']}" if "item" in run.error else ""
        where = f"step {run.failed_step}{item}: " if run.failed_step else ""
        pairs.append(("error", f"{where}{_error_summary(run.error, width=200)}"))
    _output.fields(pairs)
    _output.heading("input")
    _output.block(_output.pretty_json(detail.input))
    if detail.result_step is not None and run.state == RunState.COMPLETED:
        _output.heading(f"result (step {detail.result_step})")
        _output.block(_output.pretty_json(detail.result))
    _output.heading("steps")
    _output.table(_STEP_COLUMNS, detail.steps)
    for step in detail.steps:
        if step.running_for is not None:
            _output.heading(
                f"step {step.name}, attempt {step.attempt}, running for "
                f"{_output.duration(step.running_for)} on worker {step.worker_id or '-'}"
            )
    for step in detail.steps:
        _print_errors(step.errors, f"step {step.name}")


def _step_state(step: StepStatus) -> str:
    """A step's state; for a map node that made its items, how many of them completed."""
    if step.items_total is None:
        return step.state.value
    return f"{step.state.value} ({step.items_done}/{step.items_total} items)"


def _step_duration(step: StepStatus) -> str:
    """How long its last attempt took; for a step running, how long it has run so far."""
    if step.running_for is not None:
        return f"{_output.duration(step.running_for)} so far"
    return _output.duration(step.duration)


def _step_waits(step: StepStatus) -> str:
    """What a step waits for, if it waits: a signal, a time, its run's start, its retry."""
    at = _output.when(step.wakes_at)
    if step.waiting_for is not None:
        timeout = f" (times out at {at})" if step.wakes_at is not None else ""
        return f"waiting for {step.waiting_for!r}{timeout}"
    if step.wakes_at is None:
        return "-"
    if step.parked == Parked.SLEEPING:
        return f"sleeping until {at}"
    if step.parked == Parked.DELAYED:
        return f"starts at {at}"
    return f"retries at {at}" if step.errors else f"due at {at}"


def _run_parked(detail: RunDetail) -> str:
    """Why a parked run waits, from its steps: the signals, or the earliest time it wakes."""
    parked = detail.status.parked
    steps = [s for s in detail.steps if s.parked == parked]
    if parked == Parked.WAITING:
        return "waiting for " + ", ".join(repr(s.waiting_for) for s in steps)
    times = [s.wakes_at for s in steps if s.wakes_at is not None]
    at = _output.when(min(times)) if times else "-"
    return f"sleeping until {at}" if parked == Parked.SLEEPING else f"starts at {at}"


def _print_job_detail(detail: JobDetail) -> None:
    job = detail.status
    item = "" if detail.item is None else f" item {detail.item}"
    what = [("kind", job.kind), ("key", job.key or "-")]
    if detail.run_id is not None:
        what = [
            ("run", str(detail.run_id)),
            ("workflow", detail.workflow or "-"),
            ("step", f"{job.kind}{item}"),
        ]
    _output.fields(
        [
            ("job", str(job.id)),
            *what,
            ("queue", job.queue),
            ("priority", str(job.priority)),
            ("state", job.state.value),
            ("attempts", f"{job.attempt}/{job.max_attempts}"),
            ("created", _output.when(job.created_at)),
            ("scheduled", _output.when(job.scheduled_at)),
            ("started", _output.when(detail.started_at)),
            ("finished", _output.when(job.finished_at)),
        ]
    )
    _output.heading("args" if detail.run_id is None else "item" if item else "input")
    _output.block(_output.pretty_json(detail.args))
    if job.state == JobState.COMPLETED:
        _output.heading("output")
        _output.block(_output.pretty_json(detail.output))
    _print_errors(job.errors, f"job {job.id}")


def _job_record(job: JobStatus) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "key": job.key,
        "queue": job.queue,
        "priority": job.priority,
        "state": job.state.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created_at": job.created_at,
        "scheduled_at": job.scheduled_at,
        "finished_at": job.finished_at,
        "error": job.errors[-1] if job.errors else None,
        "errors": job.errors,
    }


def _job_detail_record(detail: JobDetail) -> dict[str, Any]:
    return {
        **_job_record(detail.status),
        "started_at": detail.started_at,
        "worker_id": detail.worker_id,
        "args": detail.args,
        "output": detail.output,
        "run_id": None if detail.run_id is None else str(detail.run_id),
        "workflow": detail.workflow,
        "item": detail.item,
    }


_RUN_COLUMNS: list[_output.Column] = [
    ("ID", lambda r: str(r.id)),
    ("WORKFLOW", lambda r: r.workflow),
    ("KEY", lambda r: r.key or "-"),
    ("STATE", lambda r: r.state.value),
    ("PARKED", lambda r: "-" if r.parked is None else r.parked.value),
    ("CREATED (UTC)", lambda r: _output.when(r.created_at)),
    ("FINISHED (UTC)", lambda r: _output.when(r.finished_at)),
    ("ERROR", lambda r: _error_summary(r.error)),
]

_STEP_COLUMNS: list[_output.Column] = [
    ("STEP", lambda s: s.name),
    ("STATE", lambda s: _step_state(s)),
    ("ATTEMPTS", lambda s: f"{s.attempt}/{s.max_attempts}"),
    ("QUEUE", lambda s: s.queue),
    ("STARTED (UTC)", lambda s: _output.when(s.started_at)),
    ("DURATION", lambda s: _step_duration(s)),
    ("WAITING (UTC)", _step_waits),
    ("ERROR", lambda s: _error_summary(s.errors[-1] if s.errors else None)),
]

_JOB_COLUMNS: list[_output.Column] = [
    ("ID", lambda j: str(j.id)),
    ("KIND", lambda j: j.kind),
    ("QUEUE", lambda j: j.queue),
    ("KEY", lambda j: j.key or "-"),
    ("STATE", lambda j: j.state.value),
    ("ATTEMPTS", lambda j: f"{j.attempt}/{j.max_attempts}"),
    ("CREATED (UTC)", lambda j: _output.when(j.created_at)),
    ("SCHEDULED (UTC)", lambda j: _output.when(j.scheduled_at)),
    ("ERROR", lambda j: _error_summary(j.errors[-1] if j.errors else None)),
]

_JOB_STATES = [s.value for s in JobState]


def _schedule_record(schedule: ScheduleStatus) -> dict[str, Any]:
    return {
        "name": schedule.name,
        "workflow": schedule.workflow,
        "cron": schedule.cron,
        "every": schedule.every,
        "timezone": schedule.timezone,
        "missed": schedule.missed,
        "max_catch_up": schedule.max_catch_up,
        "paused": schedule.paused,
        "last_tick": schedule.last_tick,
        "next_tick": schedule.next_tick,
        "updated_at": schedule.updated_at,
    }


def _when_fired(schedule: ScheduleStatus) -> str:
    if schedule.cron is not None:
        return f"cron {schedule.cron}"
    return f"every {_output.duration(schedule.every)}"


_SCHEDULE_COLUMNS: list[_output.Column] = [
    ("NAME", lambda s: s.name),
    ("WORKFLOW", lambda s: s.workflow),
    ("SCHEDULE", _when_fired),
    ("TIMEZONE", lambda s: s.timezone),
    ("MISSED", lambda s: s.missed),
    ("PAUSED", lambda s: "yes" if s.paused else "no"),
    ("LAST TICK (UTC)", lambda s: _output.when(s.last_tick)),
    ("NEXT TICK (UTC)", lambda s: _output.when(s.next_tick)),
]

cli: click.Group = build_cli()

# click >= 8.2 raises this for a group given no command; older versions print the help.
_NO_ARGS: type[click.UsageError] = getattr(
    click.exceptions, "NoArgsIsHelpError", type("_Never", (click.UsageError,), {})
)


def _reader_gone() -> int:
    """The reader of stdout went away (``| head``): point stdout at /dev/null so Python's
    flush at exit raises no second error, and return the exit status for it (141, as a
    shell reports a process that SIGPIPE ended)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_BROKEN_PIPE


def run(argv: Sequence[str] | None = None) -> int:
    """Run :data:`cli` as the ``cyclone`` program; every error is one line on stderr."""
    return run_group(cli, list(sys.argv[1:] if argv is None else argv), "cyclone")


def run_group(group: click.Group, args: list[str], prog_name: str) -> int:
    """Run ``group`` (:data:`cli`, or a host's :func:`build_cli`) as a program named
    ``prog_name`` and return its exit status; every error is one line on stderr.

    ``manage.py cyclone`` runs its group through this, so that its errors, its help when
    given no command, and its exit statuses are those of the ``cyclone`` program.
    """
    try:
        result = group.main(args=args, prog_name=prog_name, standalone_mode=False)
    except _NO_ARGS as exc:
        click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message(), err=True)
        return EXIT_USAGE
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog_name
        click.echo(f"cyclone: {exc.format_message()} (see '{where} --help')", err=True)
        return EXIT_USAGE
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("cyclone: interrupted", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone()
    return result if isinstance(result, int) else 0
