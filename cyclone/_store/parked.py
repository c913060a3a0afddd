"""Parked work: the expressions that tell a run or a step waiting for a signal, sleeping, or
delayed from one that runs, for the read model (:mod:`cyclone._store.reads`, ``counts``).

A parked run keeps the state ``running``; what parks it is read from its rows:

- *delayed*: submitted with ``run_at=``/``delay=``, not started, its ``start_at`` ahead;
- *waiting*: a wait node parked for its signal, which left its marker, a signal row
  without a payload (:mod:`cyclone._store.waits`);
- *sleeping*: a sleep node parked until its time: available, scheduled ahead, no attempt
  counted (a step in its retry backoff has one), and named a sleep node by the run's graph.

A run is parked only while none of its steps runs or is due; delayed comes first, then
waiting, then sleeping. Each filter names its candidates through an index whose predicate
it states (the markers' partial index, the claim index of workflow steps, the index of
runs to start), so finding the parked runs costs the parked work, never the history.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, Select, and_, case, cast, exists, func, or_, select
from sqlalchemy.dialects.postgresql import JSONB, JSONPATH

from cyclone._store import definitions as _definitions
from cyclone._store.executor import const
from cyclone.schema import jobs, runs, signals
from cyclone.states import JobState, Parked, RunState

_SLEEP_NODE = "$.steps[*] ? (@.name == $name && exists(@.sleep))"
"""A step of the run's graph (:class:`cyclone._graph.NodeSnapshot`) that is a sleep node."""

_RUNNING = const(RunState.RUNNING.value)
_AVAILABLE = const(JobState.AVAILABLE.value)


def is_sleep_node(graph: Any, kind: Any) -> Any:
    """Whether step ``kind`` is a sleep node of ``graph`` (a run's graph, jsonb)."""
    return func.jsonb_path_exists(
        graph,
        cast(const(_SLEEP_NODE), JSONPATH),
        cast(func.jsonb_build_object(const("name"), kind), JSONB),
    )


def _scheduled_ahead(job: Any) -> Any:
    return and_(job.c.state == _AVAILABLE, job.c.scheduled_at > func.now())


def signal_of(job: Any) -> Any:
    """The signal a wait node's job waits for (its ``args``), else NULL."""
    return job.c.args.op("->>")(const("signal"))


def waiting_step(job: Any) -> Any:
    """Whether ``job`` (a step's row) is a wait node parked for its signal."""
    marker = signals.alias("marker")
    return and_(
        job.c.state.in_([const(JobState.BLOCKED.value), _AVAILABLE]),
        exists().where(
            marker.c.run_id == job.c.run_id,
            marker.c.name == signal_of(job),
            marker.c.payload.is_(None),
        ),
    )


def sleeping_step(job: Any, graph: Any) -> Any:
    """Whether ``job`` (a step's row of a run whose graph is ``graph``) is a parked sleep node."""
    return and_(
        _scheduled_ahead(job),
        job.c.attempt == const(0, Integer),
        is_sleep_node(graph, job.c.kind),
    )


def wakes_at(job: Any) -> Any:
    """When ``job`` (a step's row, or a step of a run not started) becomes runnable, if that
    is ahead: its ``scheduled_at`` while it is available and not due; else NULL."""
    return case((_scheduled_ahead(job), job.c.scheduled_at))


def step_parked(job: Any) -> Any:
    """``'waiting'``, ``'sleeping'`` or NULL for a step's row (``cyclone_jobs``)."""
    owner = runs.alias("owner")
    sleeps = exists().where(
        owner.c.id == job.c.run_id, sleeping_step(job, _definitions.graph_of(owner))
    )
    return case(
        (waiting_step(job), const(Parked.WAITING.value)),
        (sleeps, const(Parked.SLEEPING.value)),
    )


def unstarted_step_parked(step: Any) -> Any:
    """``'delayed'`` for a root of a run not started whose start is ahead, else NULL."""
    return case((_scheduled_ahead(step), const(Parked.DELAYED.value)))


def _busy(run: Any) -> Any:
    """Whether a step of ``run`` runs or is due now."""
    job = jobs.alias("busy")
    return exists().where(
        job.c.run_id == run.c.id,
        or_(
            job.c.state == const(JobState.RUNNING.value),
            and_(job.c.state == _AVAILABLE, job.c.scheduled_at <= func.now()),
        ),
    )


def _has_marker(run: Any) -> Any:
    marker = signals.alias("marker")
    return exists().where(marker.c.run_id == run.c.id, marker.c.payload.is_(None))


def _has_sleeper(run: Any) -> Any:
    job = jobs.alias("sleeper")
    return exists().where(job.c.run_id == run.c.id, sleeping_step(job, _definitions.graph_of(run)))


def run_parked(run: Any = runs) -> Any:
    """``'delayed'``, ``'waiting'``, ``'sleeping'`` or NULL for a row of ``run`` (the runs
    table or an alias of it). Costs nothing for an ended run, a few index probes by run id
    for a running one."""
    return case(
        (run.c.state != _RUNNING, None),
        (run.c.start_at > func.now(), const(Parked.DELAYED.value)),
        (run.c.start_at.is_not(None), None),
        (_busy(run), None),
        (_has_marker(run), const(Parked.WAITING.value)),
        (_has_sleeper(run), const(Parked.SLEEPING.value)),
    )


def candidates(kind: Parked) -> Select[Any] | None:
    """The ids of the runs that may be parked as ``kind``, read from an index (None for
    delayed, whose runs :func:`filters` reads from the index of runs to start)."""
    if kind is Parked.WAITING:
        return select(signals.c.run_id).where(signals.c.payload.is_(None))
    if kind is Parked.SLEEPING:
        # The claim index of workflow steps: its predicate is stated.
        return select(jobs.c.run_id).where(
            jobs.c.state == _AVAILABLE,
            jobs.c.workflow.is_not(None),
            jobs.c.scheduled_at > func.now(),
            jobs.c.attempt == const(0, Integer),
        )
    return None


def filters(kind: Parked, run: Any = runs) -> list[Any]:
    """The conditions on ``run`` (the runs table or an alias) of the runs parked as ``kind``."""
    if kind is Parked.DELAYED:
        # The predicate of ix_cyclone_runs_start, then its key.
        return [run.c.start_at.is_not(None), run.c.state == _RUNNING, run.c.start_at > func.now()]
    found = candidates(kind)
    assert found is not None
    return [run.c.state == _RUNNING, run.c.id.in_(found), run_parked(run) == const(kind.value)]
