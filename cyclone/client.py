"""``Client``: the one read API of cyclone's runs and jobs (listings with keyset
pagination, details, counts), and purging.

The CLI, the dashboard and the Django admin's actions read through it; its statements
live in :mod:`cyclone._store.reads` and :mod:`cyclone._store.counts`.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine

from cyclone import _codec, errors, schedules
from cyclone._store import binds as _binds
from cyclone._store import control as _control
from cyclone._store import counts as _counts
from cyclone._store import limits as _limits
from cyclone._store import lookup as _lookup
from cyclone._store import queues as _queues
from cyclone._store import reads as _reads
from cyclone._store import standalone as _standalone
from cyclone._store import sweep as _sweeper
from cyclone._store import workers as _workers
from cyclone.jobs import JobStatus
from cyclone.runs import RunStatus
from cyclone.schedules import ScheduleStatus
from cyclone.schema import MAX_INTEGER
from cyclone.states import EDGES, JobState, Parked, RunState

DEFAULT_PAGE = 100
DEFAULT_BULK_BATCH = 500
"""Runs one transaction of :meth:`Client.retry_runs` or :meth:`Client.cancel_runs` changes."""
DEFAULT_SCAN = 10_000
"""Runs :meth:`Client.page_runs` reads, at most, to fill a page with a key prefix."""


@dataclass(frozen=True, slots=True)
class StepStatus:
    """One step of a run as its job stands: state, attempts, timing, every error and output.

    Each error is a dict with ``type``, ``message``, ``traceback``, ``attempt`` and ``at``.
    """

    name: str
    job_id: int | None
    """None while the run has not started: its steps are created when a worker starts it."""
    state: JobState
    queue: str
    attempt: int
    max_attempts: int
    scheduled_at: datetime
    """The earliest moment its next attempt may start (a delay, a backoff, a sleep)."""
    started_at: datetime | None
    """When its last attempt started; None before the first."""
    finished_at: datetime | None
    """When the step reached a terminal state; None until then."""
    errors: list[dict[str, Any]]
    output: Any
    """The step's output, decoded (None until it completes)."""
    worker_id: str | None
    """The worker that ran (or runs) its last attempt."""
    waiting_for: str | None = None
    """The signal a parked wait node waits for; None for any other step, and once the
    signal has arrived."""
    wakes_at: datetime | None = None
    """When the step becomes runnable, while that is ahead: a parked sleep node's time, the
    start of a delayed run (its first steps), the end of a retry's backoff, a wait node's
    timeout; else None."""
    parked: Parked | None = None
    """``WAITING`` (see ``waiting_for``), ``SLEEPING`` (a sleep node until ``wakes_at``),
    ``DELAYED`` (a first step of a run that starts at ``wakes_at``), else None."""
    items_done: int | None = None
    """A map node's items completed, once it has made them; None for any other step."""
    items_total: int | None = None
    """A map node's items (one per element of the list it maps over), once it has made
    them; None for any other step."""
    running_for: timedelta | None = None
    """While the step runs, how long its attempt has been running (from ``started_at`` to
    ``RunDetail.read_at``); ``worker_id`` names the worker that holds it. None otherwise."""

    @property
    def duration(self) -> timedelta | None:
        """How long the last attempt took, once it has ended."""
        if self.started_at is None or self.finished_at is None:
            return None
        return max(self.finished_at - self.started_at, timedelta())


@dataclass(frozen=True, slots=True)
class RunDetail:
    """A run with its input, graph, its result node's output (if any) and its steps in order,
    all read as of one moment."""

    status: RunStatus
    input: Any
    result_step: str | None
    result: Any
    steps: list[StepStatus]
    graph: dict[str, Any]
    """The graph the run was submitted with: ``{"steps": [{"name", "after", ...}, ...]}``."""
    steps_remaining: int
    """Steps not yet completed, as the run counts them."""
    read_at: datetime
    """The database's clock when this was read, to measure the run's times against."""
    children: list[RunStatus] = field(default_factory=list)
    """The runs its child nodes submitted (``@wf.child``), node by node (in the order the
    nodes made their first child) and a map of children's in item order; their
    ``parent_node`` names the node, ``parent_item`` the item. The first
    ``children_limit`` of them when :meth:`Client.get_run_detail` was given one."""
    children_total: int = 0
    """How many child runs it has, listed in ``children`` or not."""


@dataclass(frozen=True, slots=True)
class JobDetail:
    """A job with its arguments, its output and its last attempt's start and worker: a
    standalone job, or the job of a step of a run (``run_id`` names the run)."""

    status: JobStatus
    args: Any
    """A standalone job's arguments; a step's: its run's input (a map item's: its item)."""
    output: Any
    started_at: datetime | None
    worker_id: str | None
    run_id: uuid.UUID | None = None
    """The run whose step this job is; None for a standalone job."""
    workflow: str | None = None
    """That run's workflow; None for a standalone job."""
    item: int | None = None
    """A map item's position in the list its node maps over; None for any other job."""


class Position(Protocol):
    """Where a listing stands: a RunStatus or JobStatus of the last page, or any object with
    its ``created_at`` and ``id``."""

    @property
    def created_at(self) -> datetime: ...

    @property
    def id(self) -> Any: ...


@dataclass(frozen=True, slots=True)
class RunPage:
    """A page of runs (:meth:`Client.page_runs`) and where the next one starts.

    ``next`` is None on the last page; pass it as ``after`` for the next. ``searched_to``
    is set when the page stopped short because it read its ``scan`` of runs without
    filling up: the next page goes on with the runs created before that moment.
    """

    runs: list[RunStatus]
    next: RunStatus | None
    searched_to: datetime | None = None


@dataclass(frozen=True, slots=True)
class ActiveJobs:
    """Active jobs of one queue, workflow and kind: due now, scheduled later, running.

    ``workflow`` is None for standalone jobs. Steps blocked on their upstream steps are
    not counted: they wait on their run, not on a queue.
    """

    queue: str
    workflow: str | None
    kind: str
    ready: int
    scheduled: int
    running: int


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """One queue: whether it is paused, and its active jobs (steps and standalone jobs).

    ``available`` counts the jobs due now, ``scheduled`` those due later, ``running``
    those being run (a paused queue's running jobs finish; its available ones wait).
    """

    name: str
    paused: bool
    paused_at: datetime | None
    """When it was paused; None while it is not."""
    available: int
    scheduled: int
    running: int


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """One running worker as its row in ``cyclone_workers`` stands (:meth:`Client.list_workers`).

    A worker writes the row when it starts serving, beats it every ``heartbeat_interval``
    (busy or idle) and deletes it when it stops; the maintenance leader deletes the row of
    a worker silent for its ``rescue_after`` (killed, frozen, cut off), with its jobs' rescue.
    """

    id: str
    """The worker's id, ``host:pid:hex``: the ``worker_id`` of the jobs it runs."""
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    """Its last heartbeat: a worker alive beats every ``heartbeat_interval``."""
    concurrency: int
    queues: list[str] | None
    """The queues it serves; None for every queue."""
    workflows: list[str]
    steps: list[str]
    """The standalone step kinds it serves."""
    version: str
    """The cyclone version it runs."""
    stopping_at: datetime | None
    """When it began to stop (it waits for its running jobs); None while it runs."""
    running: int
    """The jobs running under its id."""
    rescue_after: timedelta | None
    """The silence after which the maintenance leader hands its jobs back and deletes its
    row (its ``Worker(rescue_after=)``); None for a worker of a cyclone older than revision
    ``cyclone_0026_worker_rescue_after``: the leader's own then."""
    read_at: datetime
    """The database's clock when this was read, to measure ``heartbeat_at`` against."""

    @property
    def silent_for(self) -> timedelta:
        """How long since its last heartbeat, as of ``read_at``."""
        return max(self.read_at - self.heartbeat_at, timedelta())


@dataclass(frozen=True, slots=True)
class FinishedMinute:
    """How many runs and standalone jobs completed and failed in one minute."""

    minute: datetime
    completed: int
    failed: int


@dataclass(frozen=True, slots=True)
class LimitStatus:
    """One named limit and, per key with something running or waiting, how many.

    ``per`` is set for a ``Rate`` (``max`` starts per ``per``); ``counts`` says what
    ``running`` counts: ``"attempts"``, ``"runs"`` or ``"starts"``. ``keys`` maps each key
    to ``(running, waiting)``; the key of a limit given no ``key=`` is ``""``.
    """

    name: str
    max: int
    per: timedelta | None
    counts: str
    on_limit: str
    set_by_operator: bool
    keys: dict[str, tuple[int, int]]


def _json(text: str | None) -> Any:
    return None if text is None else _codec.decode(text)


def _position(after: Position | str | None, id_type: type[Any]) -> tuple[datetime, Any] | None:
    """The ``(created_at, id)`` of a listing's ``after``: a status, or its ``cursor`` text."""
    if after is None:
        return None
    if not isinstance(after, str):
        if not hasattr(after, "created_at") or not hasattr(after, "id"):
            raise TypeError(
                f"after= takes the last status listed or its cursor, not {type(after).__name__}"
            )
        return (after.created_at, _cursor_id(after.id, id_type, after))
    created, sep, ident = after.partition("~")
    try:
        if not sep:
            raise ValueError("no separator")
        when = datetime.fromisoformat(created)
        if when.tzinfo is None:
            raise ValueError("no offset")
        return (when, _cursor_id(id_type(ident), id_type, after))
    except ValueError:
        raise ValueError(
            f"after={after!r} is not a cursor: pass the cursor of the last run or job listed"
        ) from None


def _cursor_id(ident: Any, id_type: type[Any], after: object) -> Any:
    """A cursor's id, checked: a job's is an int in ``bigint``'s range (one past it, from a
    cursor's text or a hand-made position, failed in the driver with "bigint out of
    range")."""
    if id_type is int and (
        isinstance(ident, bool) or not isinstance(ident, int) or not -(2**63) <= ident < 2**63
    ):
        raise ValueError(
            f"after={after!r} is not a cursor: pass the cursor of the last run or job listed"
        )
    return ident


def _run_uuid(run_id: uuid.UUID | str) -> uuid.UUID:
    """The UUID of a run id given as a UUID or its text.

    Anything else is a TypeError, as ``wf.run`` raises (``get_run(None)`` looked up
    ``"None"`` and said "badly formed hexadecimal UUID string"); text that is no UUID is
    uuid's ValueError.
    """
    if isinstance(run_id, uuid.UUID):
        return run_id
    if not isinstance(run_id, str):
        raise TypeError(f"a run id is a uuid.UUID or its str, not {type(run_id).__name__}")
    return uuid.UUID(run_id)


class HasName(Protocol):
    """Anything with a ``name``, such as a Workflow."""

    @property
    def name(self) -> str: ...


def _text(value: str | None, name: str) -> str | None:
    """A text filter (``key``, ``kind``, ``queue``), or None for none.

    A value that is not a str is a TypeError, and a str PostgreSQL's text cannot hold (a
    NUL, a lone surrogate) a ValueError, before a statement is sent: they failed in the
    driver (an operator error, "cannot contain NUL (0x00) bytes") or in its encoder.
    """
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name}= takes a str, not {type(value).__name__}")
    if "\x00" in value:
        raise ValueError(f"{name}={value!r} contains NUL, which no stored {name} has")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{name}={value!r} is not valid UTF-8 (it holds a lone surrogate)"
        ) from None
    return value


def _stored_name(value: object, what: str) -> str:
    """The name of a schedule or limit to change: not a str is a TypeError, and a str
    PostgreSQL's text cannot hold (a NUL, a lone surrogate) a ValueError, before a
    statement is sent. They failed in the driver ("cannot contain NUL (0x00) bytes") or
    its encoder (``UnicodeEncodeError``), or said that no schedule is named ``5``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} is a str, not {type(value).__name__}")
    _text(value, "name")
    return value


def _workflow_name(workflow: str | HasName | None) -> str | None:
    """The name a workflow filter gives: a name, or a Workflow's (anything with a ``name``).

    Anything else is a TypeError before a statement is sent, not the driver's failure to
    adapt it.
    """
    if workflow is None or isinstance(workflow, str):
        return _text(workflow, "workflow")
    name = getattr(workflow, "name", None)
    if not isinstance(name, str):
        raise TypeError(
            f"workflow= takes a workflow's name or the Workflow, not {type(workflow).__name__}"
        )
    return name


class Client:
    """Wraps an Engine; every workflow method that takes an Engine also takes a Client.

    Each read opens a short autocommit connection of its own, except inside
    :meth:`snapshot`, whose reads all see one moment.

    Example:
        client = cyclone.Client(engine)
        failed = client.list_runs(workflow="checkout", state=cyclone.RunState.FAILED)
    """

    def __init__(self, engine: Engine) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(f"Client takes a SQLAlchemy Engine, not {type(engine).__name__}")
        self._engine = engine
        self._snapshot: Connection | None = None

    @property
    def engine(self) -> Engine:
        return self._engine

    def __repr__(self) -> str:
        return f"<cyclone.Client {self._engine.url!r}>"

    @contextmanager
    def snapshot(self) -> Iterator[Client]:
        """A Client whose reads all see the database as of one moment, until the block ends.

        Its reads share one read-only ``REPEATABLE READ`` transaction on one connection,
        so a page that shows several reads (counts, a listing and its filter's choices)
        shows them consistent with each other. Its write methods (cancel, purge, pause)
        still run in transactions of their own.

        Example:
            with client.snapshot() as reader:
                counts = reader.count_runs()
                failed = reader.list_runs(state=cyclone.RunState.FAILED)
        """
        if self._snapshot is not None:
            yield self
            return
        connection = self._engine.connect().execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        with connection as conn, conn.begin():
            reader = Client(self._engine)
            reader._snapshot = conn
            yield reader

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        """The connection of one read: the snapshot's, else a pooled one in autocommit."""
        if self._snapshot is not None:
            yield self._snapshot
            return
        with _binds.autocommit(self._engine) as conn:
            yield conn

    @contextmanager
    def _reading_together(self) -> Iterator[Connection]:
        """The connection of a read of several statements that must see one moment."""
        with self.snapshot() as reader:
            assert reader._snapshot is not None
            yield reader._snapshot

    def list_runs(
        self,
        *,
        workflow: str | HasName | None = None,
        state: RunState | str | None = None,
        key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = DEFAULT_PAGE,
        after: Position | str | None = None,
        parked: Parked | str | None = None,
    ) -> list[RunStatus]:
        """Runs newest first. Pass the last run of a page, or its ``cursor``, as ``after``
        for the next page. ``workflow`` is a workflow's name, or the Workflow.

        ``since`` and ``until`` (aware datetimes) keep the runs created in ``[since, until)``.
        ``parked`` (``"waiting"``, ``"sleeping"``, ``"delayed"``: a :class:`cyclone.Parked`)
        keeps the running runs parked so (``RunStatus.parked``); they are found through
        indexes, so the listing costs the parked runs, not the history.

        Pagination is by ``(created_at, id)``, so pages neither repeat nor skip runs
        while new runs are submitted.
        """
        found_state = _member(RunState, state, "state")
        found_parked = _member(Parked, parked, "parked")
        since = None if since is None else _aware(since, "since")
        until = None if until is None else _aware(until, "until")
        limit = _limit(limit)
        with self._reading() as conn:
            rows = _reads.list_runs(
                conn,
                workflow=_workflow_name(workflow),
                state=found_state,
                key=_text(key, "key"),
                since=since,
                until=until,
                after=_position(after, uuid.UUID),
                limit=limit,
                parked=found_parked,
            )
        return [RunStatus(*row) for row in rows]

    def retry_runs(
        self,
        *,
        workflow: str | HasName | None = None,
        state: RunState | str | None = None,
        key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        parked: Parked | str | None = None,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BULK_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Retry every failed or cancelled run that :meth:`list_runs` lists with these filters.

        Each run is retried as :meth:`cyclone.Run.retry` retries it (its failed and
        cancelled steps run again), by the same guarded statements, in transactions of
        ``batch_size`` runs at most, newest first; runs submitted after the call began
        are left alone. A run it may not retry (past its deadline, a step of it still
        running, retried or purged meanwhile) is skipped; so is every run in another
        state (``state="completed"`` retries nothing). ``progress`` is called with the
        number retried after each batch. Not inside :meth:`snapshot`'s block.

        Returns:
            How many runs it retried; with ``dry_run``, how many failed and cancelled runs
            match now (it changes nothing).

        Example:
            client.retry_runs(workflow="checkout", state=cyclone.RunState.FAILED)
        """
        return self._bulk(
            EDGES["run.retry"].sources,
            _control.restart_many,
            workflow=workflow,
            state=state,
            key=key,
            since=since,
            until=until,
            parked=parked,
            dry_run=dry_run,
            batch_size=batch_size,
            progress=progress,
        )

    def cancel_runs(
        self,
        *,
        workflow: str | HasName | None = None,
        state: RunState | str | None = None,
        key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        parked: Parked | str | None = None,
        dry_run: bool = False,
        batch_size: int = DEFAULT_BULK_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Cancel every running run that :meth:`list_runs` lists with these filters.

        Each run is cancelled as :meth:`cyclone.Run.cancel` cancels it (steps not started
        never start; running ones finish), in transactions of ``batch_size`` runs at
        most, newest first; runs submitted after the call began are left alone, and so
        are runs that ended meanwhile. ``progress`` is called with the number cancelled
        after each batch.

        Returns:
            How many runs it cancelled; with ``dry_run``, how many running runs match now
            (it changes nothing).

        Example:
            client.cancel_runs(workflow="checkout", since=an_hour_ago)
        """
        return self._bulk(
            EDGES["run.cancel"].sources,
            _control.cancel_many,
            workflow=workflow,
            state=state,
            key=key,
            since=since,
            until=until,
            parked=parked,
            dry_run=dry_run,
            batch_size=batch_size,
            progress=progress,
        )

    def _bulk(
        self,
        sources: tuple[str, ...],
        act: Callable[[Engine, list[uuid.UUID]], int],
        *,
        workflow: str | HasName | None,
        state: RunState | str | None,
        key: str | None,
        since: datetime | None,
        until: datetime | None,
        parked: Parked | str | None,
        dry_run: bool,
        batch_size: int,
        progress: Callable[[int], None] | None,
    ) -> int:
        """Act on the runs listed with these filters in ``sources``, batch by batch."""
        wanted = [RunState(s) for s in sources]
        if state is not None:
            wanted = [s for s in wanted if s == _member(RunState, state, "state")]
        filters: dict[str, Any] = {
            "workflow": _workflow_name(workflow),
            "states": wanted,
            "key": _text(key, "key"),
            "since": None if since is None else _aware(since, "since"),
            "until": None if until is None else _aware(until, "until"),
            "parked": _member(Parked, parked, "parked"),
        }
        batch_size = _limit(batch_size, "batch_size")
        if not wanted:
            return 0
        if dry_run:
            with self._reading() as conn:
                return _reads.count_listed(conn, **filters)
        changed = 0
        after: tuple[datetime, uuid.UUID] | None = None
        while True:
            with _binds.autocommit(self._engine) as conn:
                batch = _reads.listed_run_ids(conn, **filters, after=after, limit=batch_size)
            if not batch:
                return changed
            done = act(self._engine, [run_id for _, run_id in batch])
            changed += done
            if progress is not None:
                progress(done)
            if len(batch) < batch_size:
                return changed
            after = batch[-1]

    def iter_runs(self, *, page_size: int = DEFAULT_PAGE, **filters: Any) -> Iterator[RunStatus]:
        """Every run matching the filters of :meth:`list_runs`, newest first, page by page."""
        after: RunStatus | None = None
        while True:
            page = self.list_runs(limit=page_size, after=after, **filters)
            yield from page
            if len(page) < page_size:
                return
            after = page[-1]

    def page_runs(
        self,
        *,
        workflow: str | HasName | None = None,
        state: RunState | str | None = None,
        key: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: Position | str | None = None,
        limit: int = DEFAULT_PAGE,
        scan: int = DEFAULT_SCAN,
        parked: Parked | str | None = None,
    ) -> RunPage:
        """A page of runs newest first, whatever the filters, at a bounded cost.

        ``key`` is an exact key, or a prefix followed by ``*``. ``since`` and ``until``
        (aware datetimes) keep the runs created in ``[since, until)``. The workflow, the
        state, an exact key, the time range and ``after`` are served by indexes; a key
        prefix is not, and is applied to at most ``scan`` runs in the order of the
        listing: a page that reads them without filling up stops there, with its
        ``searched_to`` set, so that a prefix few runs match costs a bounded read per page
        instead of a read of the whole table. Pass the page's ``next`` as ``after`` for
        the next page. The page is read as of one moment. ``parked`` keeps the runs parked
        so, as :meth:`list_runs` does (through indexes).
        """
        found_state = _member(RunState, state, "state")
        found_parked = _member(Parked, parked, "parked")
        since = None if since is None else _aware(since, "since")
        until = None if until is None else _aware(until, "until")
        limit, scan = _limit(limit), _limit(scan, "scan")
        with self._reading_together() as conn:
            rows, edge = _reads.page_runs(
                conn,
                workflow=_workflow_name(workflow),
                state=found_state,
                key=_text(key, "key"),
                since=since,
                until=until,
                after=_position(after, uuid.UUID),
                limit=limit,
                scan=scan,
                parked=found_parked,
            )
        found = [RunStatus(*row) for row in rows]
        if len(found) > limit:
            return RunPage(found[:limit], found[limit - 1])
        if edge is None:
            return RunPage(found, None)
        stopped_at = RunStatus(*edge)
        return RunPage(found, stopped_at, stopped_at.created_at)

    def list_workflows(self) -> list[str]:
        """The names of the workflows that have runs, sorted; one index entry read per name."""
        with self._reading() as conn:
            return _reads.workflow_names(conn)

    def get_run(self, run_id: uuid.UUID | str) -> RunStatus | None:
        """The run with this id, or None."""
        with self._reading() as conn:
            row = _reads.run_status(conn, _run_uuid(run_id))
        return None if row is None else RunStatus(*row)

    def get_run_detail(
        self, run_id: uuid.UUID | str, *, children_limit: int | None = None
    ) -> RunDetail | None:
        """The run with its input, graph, result and steps (one snapshot), or None.

        ``children_limit`` lists at most that many of its child runs (a map of children
        may have thousands): ``RunDetail.children_total`` counts them all.
        """
        if children_limit is not None and (
            isinstance(children_limit, bool) or not isinstance(children_limit, int)
        ):
            raise TypeError(
                f"children_limit takes an int or None, not {type(children_limit).__name__}"
            )
        if children_limit is not None and not 0 <= children_limit <= MAX_INTEGER:
            raise ValueError(f"children_limit must be an int from 0 to {MAX_INTEGER}, or None")
        with self._reading_together() as conn:
            found = _reads.run_detail(conn, _run_uuid(run_id))
            children, total = (
                ([], 0)
                if found is None
                else _reads.child_statuses(conn, _run_uuid(run_id), children_limit)
            )
        if found is None:
            return None
        run, step_rows = found
        width = len(_reads.STATUS_COLUMNS)
        input_text, result_step, graph, steps_remaining, read_at = run[width:]
        steps = [
            StepStatus(
                name=row[0],
                job_id=row[1],
                state=JobState(row[2]),
                queue=row[3],
                attempt=row[4],
                max_attempts=row[5],
                scheduled_at=row[6],
                started_at=row[7],
                finished_at=row[8],
                errors=_codec.decode(row[9]),
                output=_json(row[10]),
                worker_id=row[11],
                waiting_for=row[12],
                wakes_at=row[13],
                parked=None if row[14] is None else Parked(row[14]),
                items_done=row[15],
                items_total=row[16],
                running_for=_running_for(row[2], row[7], read_at),
            )
            for row in step_rows
        ]
        result = next((s.output for s in steps if s.name == result_step), None)
        return RunDetail(
            status=RunStatus(*_reads.run_status_fields(run)),
            input=_json(input_text),
            result_step=result_step,
            result=result if result_step else None,
            steps=steps,
            graph=_json(graph),
            steps_remaining=steps_remaining,
            read_at=read_at,
            children=[RunStatus(*fields) for fields in children],
            children_total=total,
        )

    def get_job_detail(self, job_id: int) -> JobDetail | None:
        """The job with its arguments and output, or None.

        Any job: a standalone one, or the job of a step of a run (the ids worker logs and
        ``StepStatus.job_id`` give), whose ``run_id`` and ``workflow`` name its run (its
        ``status.kind`` is the step).
        """
        if not _job_id_in_range(job_id):
            return None
        with self._reading() as conn:
            row = _reads.job_detail(conn, job_id)
        if row is None:
            return None
        width = len(_reads.JOB_STATUS_COLUMNS)
        return JobDetail(
            status=JobStatus(*_reads.job_status_fields(row)),
            args=_json(row[width]),
            output=_json(row[width + 1]),
            started_at=row[width + 2],
            worker_id=row[width + 3],
            run_id=row[width + 4],
            workflow=row[width + 5],
            item=row[width + 6],
        )

    def cancel_job(self, job_id: int) -> None:
        """Cancel a standalone job that has not started.

        Raises:
            NotFoundError: no standalone job has this id.
            InvalidStateError: the job is running or has ended.
        """
        if not _job_id_in_range(job_id):
            raise errors.NotFoundError(f"standalone job {job_id} does not exist")
        _standalone.cancel_job(self._engine, job_id)

    def retry_job(self, job_id: int) -> None:
        """Run a failed or cancelled standalone job again, from its first attempt.

        The job becomes available at once, its attempts counted afresh and its errors and
        output cleared; a worker serving its kind claims it as a new job (one guarded
        ``UPDATE``, its own transaction).

        Raises:
            NotFoundError: no job has this id.
            InvalidStateError: the job is not failed or cancelled, or is a step of a run
                (retry the run).
            DuplicateError: it has a unique key that another active job of its kind
                holds now.
        """
        if not _job_id_in_range(job_id):
            raise errors.NotFoundError(f"job {job_id} does not exist")
        _standalone.retry_job(self._engine, job_id)

    def list_limits(self) -> list[LimitStatus]:
        """Every named limit (``Concurrency``, ``Rate``), with per key how many run and wait.

        A Rate's ``running`` counts its jobs running now; its window's starts are not shown.
        """
        found: dict[str, LimitStatus] = {}
        for (
            name,
            max_,
            per,
            counts,
            on_limit,
            by_operator,
            key,
            running,
            waiting,
        ) in _limits.list_limits(self._engine):
            status = found.setdefault(
                name, LimitStatus(name, max_, per, counts, on_limit, by_operator, {})
            )
            if key is not None:
                status.keys[key] = (int(running), int(waiting))
        return list(found.values())

    def set_limit(self, name: str, max: int) -> None:
        """Set the named limit's ``max``; workers apply it at their next claim (within a
        second: the change rings them). It stays over the definitions' own ``max`` from
        then on.

        Raises:
            TypeError: ``name`` is not a str, or ``max`` not an int.
            ValueError: ``max`` is not from 0 to 2**31 - 1 (PostgreSQL's integer), or
                ``name`` holds a NUL or a lone surrogate.
            NotFoundError: no limit has this name (none was used or served yet).
        """
        _stored_name(name, "a limit's name")
        if isinstance(max, bool) or not isinstance(max, int):
            raise TypeError(f"a limit's max is an int, not {type(max).__name__}")
        if not 0 <= max <= MAX_INTEGER:
            raise ValueError(f"a limit's max is an int from 0 to {MAX_INTEGER}, not {max!r}")
        if not _limits.set_limit(self._engine, name, max):
            raise errors.NotFoundError(f"no limit is named {name!r}")

    def get_run_by_key(self, workflow: str | HasName, key: str) -> RunStatus | None:
        """The run of ``key`` of ``workflow`` (a name, or a Workflow), or None; one statement."""
        name = _workflow_name(workflow)
        if name is None:
            raise TypeError("get_run_by_key takes a workflow's name or the Workflow, not None")
        return _lookup.status_by_key(self._engine, name, key)

    def list_schedules(self) -> list[ScheduleStatus]:
        """Every schedule registered by a worker, by name, with its last and next tick."""
        return schedules.list_all(self._engine)

    def pause_schedule(self, name: str) -> bool:
        """Stop firing schedule ``name`` (its ticks while paused are never fired).

        Returns True if it was not paused before (as :meth:`pause_queue`).

        Raises:
            NotFoundError: no schedule of that name is registered.
            TypeError: ``name`` is not a str.
            ValueError: ``name`` holds a NUL or a lone surrogate.
        """
        return schedules.set_paused(self._engine, _stored_name(name, "a schedule's name"), True)

    def resume_schedule(self, name: str) -> bool:
        """Fire schedule ``name`` again, from its next tick on.

        Returns True if it was paused. A schedule that was not paused is left alone:
        the ticks it missed while no worker ran are still fired as its ``missed`` says.

        Raises:
            NotFoundError: no schedule of that name is registered.
            TypeError: ``name`` is not a str.
            ValueError: ``name`` holds a NUL or a lone surrogate.
        """
        return schedules.set_paused(self._engine, _stored_name(name, "a schedule's name"), False)

    def pause_queue(self, queue: str) -> bool:
        """Pause ``queue``: no worker claims its jobs until it is resumed.

        Its running jobs finish; its other jobs stay available (and are counted as
        such), and runs go on submitting into it. A queue no job uses yet can be paused
        ahead. A claim statement that began before the pause committed may still take
        one of its jobs. Returns True if it was not paused before.
        """
        return _queues.pause(self._engine, _queue_name(queue))

    def resume_queue(self, queue: str) -> bool:
        """Resume a paused ``queue``, waking idle workers at once (as a submit does).

        Returns True if it was paused.
        """
        return _queues.resume(self._engine, _queue_name(queue))

    def list_queues(self) -> list[QueueStatus]:
        """Every queue with active jobs or ever paused, by name, with its counts.

        The counts are those of :meth:`count_active_jobs`, summed per queue.
        """
        with self._reading_together() as conn:
            recorded = _queues.recorded(conn)
            active = _counts.active_jobs(conn)
        totals: dict[str, list[int]] = {}
        for queue, _workflow, _kind, ready, scheduled, running in active:
            total = totals.setdefault(queue, [0, 0, 0])
            total[0] += ready
            total[1] += scheduled
            total[2] += running
        paused = {name: (is_paused, at) for name, is_paused, at in recorded}
        return [
            QueueStatus(name, *paused.get(name, (False, None)), *totals.get(name, (0, 0, 0)))
            for name in sorted(totals.keys() | paused.keys())
        ]

    def list_workers(self) -> list[WorkerStatus]:
        """Every registered worker, oldest first, with the jobs running under its id.

        One statement. A worker is listed from its start until it stops, or until the
        maintenance leader deleted its row, its ``rescue_after`` after its last heartbeat
        (it was killed or is frozen). Workers of a cyclone older than revision
        ``cyclone_0025_workers`` do not register and are not listed.
        """
        with self._reading() as conn:
            rows = _workers.listed(conn)
        return [WorkerStatus(*row) for row in rows]

    def list_jobs(
        self,
        *,
        kind: str | None = None,
        state: JobState | str | None = None,
        queue: str | None = None,
        limit: int = DEFAULT_PAGE,
        after: Position | str | None = None,
    ) -> list[JobStatus]:
        """Standalone jobs newest first, paginated like :meth:`list_runs`."""
        found_state = _member(JobState, state, "state")
        limit = _limit(limit)
        with self._reading() as conn:
            rows = _reads.list_jobs(
                conn,
                kind=_text(kind, "kind"),
                state=found_state,
                queue=_text(queue, "queue"),
                after=_position(after, int),
                limit=limit,
            )
        return [JobStatus(*row) for row in rows]

    def get_job(self, job_id: int) -> JobStatus | None:
        """The standalone job with this id, or None."""
        if not _job_id_in_range(job_id):
            return None
        with self._reading() as conn:
            row = _reads.job_status(conn, job_id)
        return None if row is None else JobStatus(*row)

    def count_runs(self, *, workflow: str | HasName | None = None) -> dict[RunState, int]:
        """Runs per state (every state present, zero included), for a dashboard."""
        with self._reading() as conn:
            return _counts.runs_per_state(conn, _workflow_name(workflow))

    def count_parked_runs(self, *, workflow: str | HasName | None = None) -> dict[Parked, int]:
        """Running runs parked, per way (every one present, zero included): waiting for a
        signal, sleeping, delayed. They are among ``count_runs()[RunState.RUNNING]``; the
        read costs the parked runs (it reads indexes), never the finished history."""
        with self._reading() as conn:
            per_workflow = _counts.parked_runs(conn, _workflow_name(workflow))
        return {kind: sum(c[kind] for c in per_workflow.values()) for kind in Parked}

    def count_parked_runs_per_workflow(self) -> dict[str, dict[Parked, int]]:
        """Running runs parked, per workflow (by name; those that have any) and way (every
        one present); the read costs the parked runs, never the history."""
        with self._reading() as conn:
            return _counts.parked_runs(conn, None)

    def count_runs_per_workflow(
        self, *, up_to: int | None = None
    ) -> dict[str, dict[RunState, int]]:
        """Runs per workflow (by name) and state (every state present, zero included).

        Without ``up_to`` it reads every run. With it, each count stops at ``up_to`` (a
        count equal to ``up_to`` means "at least that many"), and the read costs at most
        ``up_to`` index entries per workflow and state, however many runs there are: what
        a dashboard wants, where "more than 10,000 completed" says enough.
        """
        up_to = None if up_to is None else _limit(up_to, "up_to")
        with self._reading() as conn:
            return _counts.runs_per_workflow(conn, up_to)

    def count_jobs(self, *, queue: str | None = None) -> dict[JobState, int]:
        """Jobs (workflow steps and standalone) per state, for a dashboard.

        The steps of a run not started yet count as it shows them: roots available, the
        others blocked.
        """
        queue = _text(queue, "queue")
        with self._reading() as conn:
            return _counts.jobs_per_state(conn, queue)

    def count_active_jobs(self) -> list[ActiveJobs]:
        """Available and running jobs per queue, workflow and kind (standalone first).

        The roots of a run not started yet count as available. The read costs the active
        jobs only (it reads partial indexes), never the finished history.
        """
        with self._reading() as conn:
            return [ActiveJobs(*row) for row in _counts.active_jobs(conn)]

    def count_finished_per_minute(self, *, minutes: int = 60) -> list[FinishedMinute]:
        """Runs and standalone jobs completed and failed per minute of the last ``minutes``,
        oldest first, every minute present (zero included)."""
        minutes = _limit(minutes, "minutes")
        with self._reading() as conn:
            rows = _counts.finished_per_minute(conn, minutes)
        return [FinishedMinute(*row) for row in rows]

    def count_purgeable(self, *, older_than: timedelta) -> tuple[int, int]:
        """How many runs and standalone jobs a purge with ``older_than`` would delete now."""
        return _sweeper.count_due(self._engine, older_than)

    def backlog(self) -> dict[str, int]:
        """Jobs waiting for a worker (available and due), per queue that has any; the roots of
        runs not started yet, due, count."""
        with self._reading() as conn:
            return _counts.due_per_queue(conn)

    def purge_terminal_runs(
        self,
        *,
        older_than: timedelta,
        batch_size: int = _sweeper.DEFAULT_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete runs that ended more than ``older_than`` ago (or their own ``retention``).

        A run's own retention, when set, replaces ``older_than`` for it. Deletes in
        batches of ``batch_size``, frees the deleted runs' keys, and returns how many runs
        it deleted. Running runs are never deleted. ``progress`` is called with the
        number deleted after each batch.
        """
        return _sweeper.purge_runs(self._engine, older_than, batch_size, progress)

    def purge_finished_jobs(
        self,
        *,
        older_than: timedelta,
        batch_size: int = _sweeper.DEFAULT_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Delete standalone jobs that ended more than ``older_than`` ago; returns how many."""
        return _sweeper.purge_jobs(self._engine, older_than, batch_size, progress)


def _running_for(state: str, started_at: datetime | None, now: datetime) -> timedelta | None:
    """How long a running step's attempt has run by ``now``; None for a step not running."""
    if state != JobState.RUNNING.value or started_at is None:
        return None
    return max(now - started_at, timedelta())


def _aware(moment: datetime, name: str) -> datetime:
    if not isinstance(moment, datetime):
        raise TypeError(f"{name}= takes a datetime, not {type(moment).__name__}")
    if moment.tzinfo is None:
        raise ValueError(f"{name} must be an aware datetime")
    return moment


E = TypeVar("E", bound=enum.Enum)


def _member(kind: type[E], value: E | str | None, name: str) -> E | None:
    """The member of ``kind`` (a str enum) that ``value`` names, or None for None.

    A value that is not a str (nor a member) is a TypeError; a str that names no member
    a ValueError.
    """
    if value is None:
        return None
    if not isinstance(value, str | kind):
        raise TypeError(f"{name}= takes a {kind.__name__} or its str, not {type(value).__name__}")
    return kind(value)


def _job_id_in_range(job_id: int) -> bool:
    """Whether ``job_id`` can name a job: an int in ``bigint``'s range (``cyclone_jobs.id``).

    An int past it names no job (the database would refuse it with ``bigint out of
    range``, a "database error" on the command line); anything else is a TypeError, raised
    before a statement is sent.
    """
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"a job id is an int, not {type(job_id).__name__}")
    return -(2**63) <= job_id < 2**63


def _queue_name(queue: str) -> str:
    if not isinstance(queue, str):
        raise TypeError(f"a queue's name is a str, not {type(queue).__name__}")
    if not queue:
        raise ValueError("queue must be a non-empty str")
    _text(queue, "queue")
    return queue


def _limit(limit: int, name: str = "limit") -> int:
    """A page or batch size: an int from 1 to PostgreSQL's integer (a larger one failed in
    the driver with "bigint out of range")."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"{name} takes an int, not {type(limit).__name__}")
    if not 1 <= limit <= MAX_INTEGER:
        raise ValueError(f"{name} must be a positive int, at most {MAX_INTEGER}")
    return limit
