"""The steps of a run not started yet, read from the graph of the definition its row names.

A submit writes the run row only; its steps become rows of ``cyclone_jobs`` when a claim
starts the run (:mod:`cyclone._store.claim`). Until then a run's ``start_at`` is set, and
whoever shows the run's steps reads them from its graph snapshot with this module: roots
available, the others blocked, no attempt made, as the claim will create them; cancelled
once the run has ended without starting.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Integer,
    Select,
    Text,
    case,
    cast,
    column,
    func,
    null,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from cyclone._store import definitions as _definitions
from cyclone._store.executor import const
from cyclone.schema import runs
from cyclone.states import JobState, RunState

STEP_FIELDS = (
    column("name", Text),
    column("after", ARRAY(Text)),
    column("max_attempts", Integer),
    column("queue", Text),
    column("priority", Integer),
    column("signal", Text),
)
"""The fields of a step in a run's graph (:class:`cyclone._graph.NodeSnapshot`)."""


def graph_steps(graph: Any) -> tuple[Any, Any]:
    """The steps of ``graph`` (a jsonb column) as FROM items: their elements with ``ord``,
    and each element's fields (``STEP_FIELDS``); join both on true after the graph's row."""
    elements = (
        func.jsonb_array_elements(graph.op("->", return_type=JSONB)(const("steps")))
        .table_valued("value", with_ordinality="ord")
        .render_derived("e")
    )
    step = (
        func.jsonb_to_record(elements.c.value)
        .table_valued(*STEP_FIELDS)
        .render_derived("s", with_types=True)
    )
    return elements, step


def is_root(step: Any) -> Any:
    """Whether a step of :func:`graph_steps` comes after no other step."""
    return func.cardinality(step.c.after) == const(0, Integer)


def _state(step: Any) -> Any:
    """A step's state before its run starts: a root available, the others blocked, and
    every step cancelled once the run ended (cancelled, or failed by its deadline) without
    starting, as a cancel marks the unstarted steps of a started run."""
    return case(
        (runs.c.state != const(RunState.RUNNING.value), const(JobState.CANCELLED.value)),
        (is_root(step), const(JobState.AVAILABLE.value)),
        else_=const(JobState.BLOCKED.value),
    )


def steps_of(run_id: Any) -> Select[Any]:
    """The steps of the run ``run_id`` if it has not started, named as ``cyclone_jobs``' columns.

    No row for a run that has started (its steps are rows of ``cyclone_jobs``).
    """
    elements, step = graph_steps(_definitions.graph_of(runs))
    return (
        select(
            step.c.name.label("kind"),
            cast(null(), BigInteger).label("id"),
            _state(step).label("state"),
            step.c.queue.label("queue"),
            step.c.priority.label("priority"),
            const(0, Integer).label("attempt"),
            step.c.max_attempts.label("max_attempts"),
            cast(const("[]"), JSONB).label("errors"),
            cast(null(), JSONB).label("output"),
            runs.c.created_at.label("created_at"),
            runs.c.start_at.label("scheduled_at"),
            cast(null(), runs.c.start_at.type).label("attempted_at"),
            cast(null(), runs.c.start_at.type).label("finalized_at"),
            cast(null(), Text).label("worker_id"),
            elements.c.ord.label("ord"),
        )
        .select_from(runs)
        .join(elements, true())
        .join(step, true())
        .where(runs.c.id == run_id, runs.c.start_at.is_not(None))
    )


def pending_steps() -> Select[Any]:
    """The steps of every running run not started yet, as :func:`steps_of` names them.

    Reads the runs of ``ix_cyclone_runs_start`` (its predicate is stated), so it costs
    the runs waiting to start, never the history.
    """
    elements, step = graph_steps(_definitions.graph_of(runs))
    return (
        select(
            runs.c.workflow.label("workflow"),
            step.c.name.label("kind"),
            _state(step).label("state"),
            step.c.queue.label("queue"),
            runs.c.start_at.label("scheduled_at"),
        )
        .select_from(runs)
        .join(elements, true())
        .join(step, true())
        .where(runs.c.start_at.is_not(None), runs.c.state == const(RunState.RUNNING.value))
    )
