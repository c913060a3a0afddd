"""The SQLAlchemy ``Table``s of cyclone, mirroring the head alembic revision exactly.

The revisions in ``alembic/versions`` own the DDL; a test proves there is no drift between
them and this module. Nothing here creates tables at runtime.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    Interval,
    MetaData,
    SmallInteger,
    Table,
    Text,
    Uuid,
    column,
    func,
    text,  # noqa: TID251 - server defaults and index predicates are DDL text
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql import ColumnElement

from cyclone.states import TERMINAL_JOB_STATES, TERMINAL_RUN_STATES, JobState, RunState

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

MAX_INTEGER = 2**31 - 1
"""The largest value of an ``Integer`` column (PostgreSQL's ``integer``): the bound of
every count a definition or an operator gives (``max_attempts``, a limit's ``max``,
``max_catch_up``), checked before anything is sent, since a larger one fails in the
database, at a submit or, worse, in every claim of a worker."""

LISTED_SINCE = "'-infinity'::timestamp with time zone"
"""The literal of the listing index's predicate; a listing states it to use the index."""


def _in(name: str, values: Iterable[str]) -> ColumnElement[bool]:
    """``name IN (...)`` over constant values, rendered by SQLAlchemy into the DDL."""
    return column(name, Text).in_(sorted(str(v) for v in values))


def _finalized_iff(terminal: Iterable[str]) -> ColumnElement[bool]:
    """A row is finalized exactly when its state is terminal."""
    return _in("state", terminal).self_group() == column("finalized_at").is_not(None).self_group()


# -- workflow definitions (revision cyclone_0016) -------------------------------------------

definitions = Table(
    "cyclone_definitions",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("workflow", Text, nullable=False),
    Column("graph", JSONB, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)
"""One row per version of a workflow's graph, keyed by a hash of the workflow's name and
graph (:func:`cyclone._store.definitions.definition_id`). A run names the version it was
submitted with (``cyclone_runs.definition``) instead of keeping a copy of the graph; the
rows are written once per process and version, and never deleted, so the runs need no
foreign key (whose check would lock the version's row on every submit)."""


runs = Table(
    "cyclone_runs",
    metadata,
    # Time-ordered (version 7, the server's clock first): a new run's entries land at the
    # right edge of the primary key and of the jobs' (run_id, ...) indexes, not on a
    # random page (revision cyclone_0027_ordered_run_ids).
    Column("id", Uuid, primary_key=True, server_default=func.cyclone_uuid7()),
    Column("workflow", Text, nullable=False),
    Column("submit_key", Text),
    Column("input", JSONB, nullable=False),
    Column("definition", Uuid, nullable=False),
    Column("result_step", Text),
    Column("state", Text, nullable=False, server_default=RunState.RUNNING.value),
    Column("steps_remaining", Integer, nullable=False),
    Column("failed_step", Text),
    Column("error", JSONB),
    Column("deadline", DateTime(timezone=True)),
    Column("retention", Interval),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("finalized_at", DateTime(timezone=True)),
    Column("trace_context", Text),
    Column("start_at", DateTime(timezone=True)),
    Column("forked_from", Uuid),
    Column("limit_name", Text),
    Column("limit_key", Text),
    Column("limit_start_at", DateTime(timezone=True)),
    Column("parent_id", Uuid, ForeignKey("cyclone_runs.id", ondelete="CASCADE")),
    Column("parent_node", Text),
    Column("parent_item", Integer),
    Column("parent_waits", Boolean, nullable=False, server_default=text("false")),
    Column("step_limits", JSONB),
    CheckConstraint(_in("state", RunState), name="state"),
    CheckConstraint(
        _finalized_iff(TERMINAL_RUN_STATES),
        name="finalized_at",
    ),
    CheckConstraint("steps_remaining >= 0", name="steps_remaining"),
)
# Every index of the runs is written by the runs it covers; each serves the queries named
# above it (tests/test_listing_indexes.py EXPLAINs those of the listings, the key, the
# claim's start and the deadlines). A new run that is no child writes five entries: the
# primary key, the key, the two listing indexes and the start index.
#
# The key: submit_once's insert (ON CONFLICT) and lookups by key (SPEC names it); a loose
# scan of it lists the workflows' names.
Index("idx_runs_submit_key", runs.c.workflow, runs.c.submit_key, unique=True)
# The listings, newest first by keyset on (created_at, id): of one state, and of one
# workflow and state, read as a range; of several states, or of every run, one range per
# state merged (a Merge Append: cyclone._store.reads._newest_first), so no index on
# (created_at, id) or (workflow, created_at, id) is kept (revision
# cyclone_0020_definitions dropped them). The dashboard's capped counts per workflow and
# state read the second alone. Partial on a predicate that is always true (created_at
# defaults to now()), which only a listing states, so no other statement filtering on
# state (the claim, deadlines, rescue) is planned onto them (revisions cyclone_0003,
# cyclone_0013); not IS NOT NULL, which PostgreSQL 17 drops from queries on a NOT NULL
# column, leaving such an index unmatched.
Index(
    "ix_cyclone_runs_listing_state",
    runs.c.state,
    runs.c.created_at,
    runs.c.id,
    postgresql_where=text(f"created_at > {LISTED_SINCE}"),
)
Index(
    "ix_cyclone_runs_listing_workflow_state",
    runs.c.workflow,
    runs.c.state,
    runs.c.created_at,
    runs.c.id,
    postgresql_where=text(f"created_at > {LISTED_SINCE}"),
)
# The runs ended per minute by state, read from the index alone (revision cyclone_0013;
# the dashboard's chart). Written when a run ends, not when it is submitted. (The
# sweeper's condition holds each run's own retention, so it reads no range of it.)
Index(
    "ix_cyclone_runs_finalized_at_state",
    runs.c.finalized_at,
    runs.c.state,
    postgresql_where=text("finalized_at IS NOT NULL"),
)
# The claim's range of the runs it starts: submitted, their steps not created yet
# (revision cyclone_0008), per workflow in start order.
Index(
    "ix_cyclone_runs_start",
    runs.c.workflow,
    runs.c.start_at,
    runs.c.id,
    postgresql_where=text("start_at IS NOT NULL AND state = 'running'"),
)
# The runs held back by a workflow's Concurrency (start_at 'infinity'), and the runs in
# progress of each limit and key (revision cyclone_0015): a limited workflow's only.
# The admission probes the first for each key in turn. ``limit_key``'s ``n_distinct`` is
# 10,000 on both tables (revision cyclone_0029_limit_key_distinct owns that DDL; the
# metadata has no such option), so that, once analyzed, statistics saying a few keys
# hold many rows do not cost that probe as a sequential scan.
Index(
    "ix_cyclone_runs_held",
    runs.c.limit_name,
    runs.c.limit_key,
    runs.c.limit_start_at,
    runs.c.id,
    postgresql_where=text("state = 'running' AND start_at = 'infinity'"),
)
Index(
    "ix_cyclone_runs_limited",
    runs.c.limit_name,
    runs.c.limit_key,
    postgresql_where=text(
        "state = 'running' AND limit_name IS NOT NULL "
        "AND (start_at IS NULL OR start_at < 'infinity')"
    ),
)
# A parent's children, and the ended children whose parent's node still waits for them
# (revision cyclone_0016_child_runs): the workers' delivery reads the second, which holds only the
# children that ended since their parent's node last looked.
Index(
    "ix_cyclone_runs_parent",
    runs.c.parent_id,
    runs.c.parent_node,
    postgresql_where=text("parent_id IS NOT NULL"),
)
Index(
    "ix_cyclone_runs_child_ended",
    runs.c.id,
    postgresql_where=text("parent_waits AND state <> 'running'"),
)
# The deadline sweep: the running runs with a deadline, soonest first.
Index(
    "ix_cyclone_runs_deadline",
    runs.c.deadline,
    postgresql_where=text("state = 'running' AND deadline IS NOT NULL"),
)

jobs = Table(
    "cyclone_jobs",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("run_id", Uuid, ForeignKey("cyclone_runs.id", ondelete="CASCADE")),
    Column("workflow", Text),
    Column("kind", Text, nullable=False),
    Column("queue", Text, nullable=False, server_default="default"),
    Column("priority", SmallInteger, nullable=False, server_default="0"),
    Column("state", Text, nullable=False),
    Column("args", JSONB),
    Column("output", JSONB),
    Column("deps", ARRAY(Text), nullable=False, server_default="{}"),
    Column("pending_deps", Integer, nullable=False, server_default="0"),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("lease", BigInteger, nullable=False, server_default="0"),
    Column("lost", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False),
    Column("errors", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("unique_key", Text),
    Column("deadline", DateTime(timezone=True)),
    Column("worker_id", Text),
    Column("scheduled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("attempted_at", DateTime(timezone=True)),
    Column("heartbeat_at", DateTime(timezone=True)),
    Column("finalized_at", DateTime(timezone=True)),
    Column("trace_context", Text),
    Column("limit_name", Text),
    Column("limit_key", Text),
    Column("item", Integer),
    Column("rate_name", Text),
    Column("rate_key", Text),
    CheckConstraint(_in("state", JobState), name="state"),
    CheckConstraint(
        _finalized_iff(TERMINAL_JOB_STATES),
        name="finalized_at",
    ),
    CheckConstraint("max_attempts > 0", name="max_attempts"),
    CheckConstraint("attempt >= 0 AND attempt <= max_attempts", name="attempt"),
    CheckConstraint("lost >= 0", name="lost"),
    CheckConstraint("(run_id IS NULL) = (workflow IS NULL)", name="run_or_standalone"),
)
# The claim indexes, one range per workflow and per standalone kind, so that a claim reads
# only the jobs its worker serves: see revision cyclone_0003. A limited step is left out
# of its workflow's range and claimed through ix_cyclone_jobs_gated (cyclone_0018_step_limits),
# and so is a limited job of a kind (cyclone_0022_kind_claim_index): one enqueued under a
# limit its kind no longer has keeps it, and is claimed by a worker that takes it on.
Index(
    "ix_cyclone_jobs_claim_workflow",
    jobs.c.workflow,
    jobs.c.priority,
    jobs.c.scheduled_at,
    jobs.c.id,
    postgresql_where=text("state = 'available' AND workflow IS NOT NULL AND limit_name IS NULL"),
)
Index(
    "ix_cyclone_jobs_claim_kind",
    jobs.c.kind,
    jobs.c.priority,
    jobs.c.scheduled_at,
    jobs.c.id,
    postgresql_where=text("state = 'available' AND workflow IS NULL AND limit_name IS NULL"),
)
CLAIM_STATISTICS = "cyclone_jobs_claim_keys"
"""Extended statistics (MCV) on the jobs' ``state, workflow, kind, limit_name``
(cyclone_0024_claim_statistics): without them the planner multiplies the conditions'
shares, estimates a handful of available jobs where thousands of a workflow wait, and may
read and sort them all through ``ix_cyclone_jobs_available`` on every claim. SQLAlchemy's
metadata has no statistics objects; the revision owns the DDL."""
# The available jobs per queue, workflow and kind, counted from the index alone
# (revision cyclone_0013).
Index(
    "ix_cyclone_jobs_available",
    jobs.c.queue,
    jobs.c.workflow,
    jobs.c.kind,
    jobs.c.scheduled_at,
    postgresql_where=text("state = 'available'"),
)
# The jobs of a Concurrency or Rate: those waiting, and those running (cyclone_0015). A
# limited claim probes the first for each key in turn (``limit_key``'s ``n_distinct``: above).
Index(
    "ix_cyclone_jobs_gated",
    jobs.c.limit_name,
    jobs.c.limit_key,
    jobs.c.priority,
    jobs.c.scheduled_at,
    jobs.c.id,
    postgresql_where=text("state = 'available' AND limit_name IS NOT NULL"),
)
Index(
    "ix_cyclone_jobs_gated_running",
    jobs.c.limit_name,
    jobs.c.limit_key,
    postgresql_where=text("state = 'running' AND limit_name IS NOT NULL"),
)
# The pairs of a limit and the Rate given with it that waiting jobs keep: a worker looks
# for the Rates its definitions no longer give, one probe per pair, however many jobs
# without the Rate wait under the same limit (cyclone_0023_rated_jobs_index).
Index(
    "ix_cyclone_jobs_rated",
    jobs.c.limit_name,
    jobs.c.rate_name,
    postgresql_where=text("state = 'available' AND rate_name IS NOT NULL"),
)
# One job per step of a run; a map node's items are jobs of its kind with their index in
# ``item``, one per index (revision cyclone_0017_map_items). It holds the steps alone, so
# the reads of a run's steps that do not fix the kind (a claimed step's upstream outputs,
# its dependents) never pass over the entries of the run's map items, as they would in
# ``ix_cyclone_jobs_run_id_kind_item`` (tests/test_listing_indexes.py).
Index(
    "ix_cyclone_jobs_run_id_kind",
    jobs.c.run_id,
    jobs.c.kind,
    unique=True,
    postgresql_where=text("item IS NULL"),
)
STEP_JOB_COLUMNS = (
    jobs.c.run_id,
    jobs.c.workflow,
    jobs.c.kind,
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.state,
    jobs.c.deps,
    jobs.c.pending_deps,
    jobs.c.max_attempts,
)
"""The columns every insert of a run's step jobs sets first (a run's start, a fork, a map's
items), each then adding its own."""

# Not partial: the index on run_id that the foreign key's cascade (a purged run's jobs)
# and every read of a run's jobs reach; a partial one would leave them a scan per run.
Index(
    "ix_cyclone_jobs_run_id_kind_item",
    jobs.c.run_id,
    jobs.c.kind,
    jobs.c.item,
    unique=True,
)
Index(
    "ix_cyclone_jobs_unique_key",
    jobs.c.kind,
    jobs.c.unique_key,
    unique=True,
    postgresql_where=text(
        "unique_key IS NOT NULL AND state IN ('available', 'blocked', 'running')"
    ),
)
# The rescue's range: running jobs whose heartbeat is old. A job has a heartbeat exactly
# while it runs. Partial on the heartbeat, not on the state, so that a statement guarding
# on ``state = 'running'`` (a record, a heartbeat) cannot combine it with its lookup by
# id: every job that ran since the last vacuum leaves an entry here, which a bitmap scan
# reads whole (cyclone_0028_heartbeat_index).
Index(
    "ix_cyclone_jobs_heartbeat_at",
    jobs.c.heartbeat_at,
    postgresql_where=text("heartbeat_at IS NOT NULL"),
)
Index(
    "ix_cyclone_jobs_standalone_finalized_at",
    jobs.c.finalized_at,
    postgresql_where=text("run_id IS NULL AND finalized_at IS NOT NULL"),
)
Index(
    "ix_cyclone_jobs_created_at_id",
    jobs.c.created_at,
    jobs.c.id,
    postgresql_where=text("run_id IS NULL"),
)


# -- schedules (revision cyclone_0006) ---------------------------------------------------

MISSED_POLICIES = ("catch_up", "latest")

schedules = Table(
    "cyclone_schedules",
    metadata,
    Column("name", Text, primary_key=True),
    Column("workflow", Text, nullable=False),
    Column("cron", Text),
    Column("every", Interval),
    Column("timezone", Text, nullable=False),
    Column("missed", Text, nullable=False),
    Column("max_catch_up", Integer, nullable=False),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("last_tick", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("(cron IS NULL) <> (every IS NULL)", name="cron_or_every"),
    CheckConstraint(_in("missed", MISSED_POLICIES), name="missed"),
    CheckConstraint("max_catch_up >= 1", name="max_catch_up"),
)


# -- signals (revision cyclone_0006) -----------------------------------------------------

signals = Table(
    "cyclone_signals",
    metadata,
    Column("run_id", Uuid, ForeignKey("cyclone_runs.id", ondelete="CASCADE"), primary_key=True),
    Column("name", Text, primary_key=True),
    Column("payload", JSONB),
    Column("sent_at", DateTime(timezone=True)),
    Column("wait_until", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("wake_pending", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("(payload IS NULL) = (sent_at IS NULL)", name="sent"),
)
# The signals sent to parked wait nodes that a claim has still to deliver (cyclone_0010).
Index(
    "ix_cyclone_signals_wake_pending",
    signals.c.run_id,
    signals.c.name,
    postgresql_where=text("wake_pending"),
)
# The markers of parked wait nodes: the runs waiting for a signal (cyclone_0011).
Index(
    "ix_cyclone_signals_waiting",
    signals.c.run_id,
    postgresql_where=text("payload IS NULL"),
)


# -- the maintenance leader's lease (revision cyclone_0009) --------------------------------

leader = Table(
    "cyclone_leader",
    metadata,
    Column("name", Text, primary_key=True),
    Column("term", BigInteger, nullable=False),
    Column("holder", Text, nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("backend_pid", Integer, nullable=False),
    CheckConstraint("term >= 1", name="term"),
)


# -- paused queues (revision cyclone_0012) ------------------------------------------------

queues = Table(
    "cyclone_queues",
    metadata,
    Column("name", Text, primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    Column("paused_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("paused = (paused_at IS NOT NULL)", name="paused_at"),
)

# -- flow control (revision cyclone_0015) -------------------------------------------------

ON_LIMIT = ("queue", "cancel_newest", "cancel_in_progress")

limits = Table(
    "cyclone_limits",
    metadata,
    Column("name", Text, primary_key=True),
    Column("max", Integer, nullable=False),
    Column("per", Interval),
    Column("on_limit", Text, nullable=False, server_default="queue"),
    Column("counts", Text, nullable=False),
    Column("set_by_operator", Boolean, nullable=False, server_default=text("false")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("max >= 0", name="max"),
    CheckConstraint("per IS NULL OR per > interval '0'", name="per"),
    CheckConstraint(_in("on_limit", ON_LIMIT), name="on_limit"),
    CheckConstraint(_in("counts", ("runs", "attempts", "starts")), name="counts"),
)

limit_keys = Table(
    "cyclone_limit_keys",
    metadata,
    Column(
        "name",
        Text,
        ForeignKey("cyclone_limits.name", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("key", Text, primary_key=True),
    Column(
        "served_at",
        DateTime(timezone=True),
        nullable=False,
        server_default=text("'-infinity'::timestamp with time zone"),
    ),
    Column("version", BigInteger, nullable=False, server_default="0"),
    Column("window_start", DateTime(timezone=True)),
    Column("window_count", Integer, nullable=False, server_default="0"),
)
Index("ix_cyclone_limit_keys_served", limit_keys.c.name, limit_keys.c.served_at, limit_keys.c.key)


# -- workers waiting for work (revision cyclone_0019_waiters) ----------------------------

waiters = Table(
    "cyclone_waiters",
    metadata,
    Column("worker_id", Text, primary_key=True),
    Column("waits_until", DateTime(timezone=True), nullable=False),
)
"""One row per worker asleep waiting for work: ``cyclone_ring()`` rings only while one is
recorded with ``waits_until`` still ahead (see :mod:`cyclone._store.notify`)."""


# -- the registry of running workers (revision cyclone_0025_workers) ---------------------

workers = Table(
    "cyclone_workers",
    metadata,
    Column("worker_id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("heartbeat_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("concurrency", Integer, nullable=False),
    Column("queues", ARRAY(Text)),
    Column("workflows", ARRAY(Text), nullable=False),
    Column("steps", ARRAY(Text), nullable=False),
    Column("version", Text, nullable=False),
    Column("stopping_at", DateTime(timezone=True)),
    Column("rescue_after", Interval),
)
"""One row per running worker (:mod:`cyclone._store.workers`): written at its start,
beaten by its heartbeat thread, deleted when it stops, or by the maintenance leader once
it has been silent for its own ``rescue_after`` (revision cyclone_0026_worker_rescue_after;
NULL in a row written before it: the leader's then). ``queues`` is NULL for a worker
serving every queue; ``stopping_at`` is set once it began to stop (it waits for its
running jobs)."""


def run_lock_order(table: Any = runs) -> tuple[Any, Any]:
    """The order in which every statement locks several runs: by creation time, then id.

    A child run (``@wf.child``) is created after its parent, in a transaction that holds
    the parent's lock, and made to sort after it even if the server's clock has stepped
    back since (:mod:`cyclone._store.children`), so this order puts a parent before its
    children, as a cancel
    walking down a tree and a child node locking its run then its child do: no two
    transactions wait for each other's runs in a cycle (see :mod:`cyclone.states`).
    """
    return table.c.created_at, table.c.id


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """An alembic ``include_name`` filter that keeps cyclone's tables out of an app's autogenerate.

    Use it in an application's ``env.py``: ``context.configure(..., include_name=...)``
    returning False for cyclone's own tables, so autogenerate never proposes to drop them.
    """
    if type_ == "table" and name is not None:
        return not (name.startswith("cyclone_"))
    return True
