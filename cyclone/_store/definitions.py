"""Workflow definitions: each version of a workflow's graph stored once, named by its hash.

A run keeps the id of its version (``cyclone_runs.definition``), not a copy of the graph:
the row is about two thirds smaller and a submit writes no graph. The version's row is
written once per process, engine and version: by the process's first autocommit submit
of the version, in the same statement (:func:`insert_cte`), or by :func:`ensure`, in an
autocommit statement of its own before the first run naming it, for the forms that join a
caller's transaction (never inside it, so two first submits cannot wait on each other's
uncommitted version row). Later submits only look it up in this process's memory. Every
reader of a run's graph goes through :func:`graph_of`, so a run, its retry and its fork's
source read the version it was submitted with.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
import weakref
from typing import Any

from sqlalchemy import Engine, Text, Uuid, bindparam, cast, select
from sqlalchemy.dialects.postgresql import JSONB, insert

from cyclone._store import executor as _executor
from cyclone.schema import definitions


def definition_id(workflow: str, graph: str) -> uuid.UUID:
    """The id of ``workflow``'s version whose graph encodes to ``graph``: the first 16 bytes of
    the SHA-256 of the name and the encoding, the same in every process that has it."""
    digest = hashlib.sha256(f"{workflow}\n{graph}".encode()).digest()
    return uuid.UUID(bytes=digest[:16])


def graph_of(run: Any) -> Any:
    """The graph (jsonb) of the version the row of ``run`` (runs, an alias, or a CTE with a
    ``definition`` column) was submitted with: a scalar subquery on the definitions' key."""
    return (
        select(definitions.c.graph)
        .where(definitions.c.id == run.c.definition)
        .correlate(run)
        .scalar_subquery()
    )


_INSERT = _executor.Compiled(
    insert(definitions)
    .values(
        id=bindparam("id", type_=definitions.c.id.type),
        workflow=bindparam("workflow", type_=Text),
        graph=cast(bindparam("graph", type_=Text), JSONB),
    )
    .on_conflict_do_nothing(index_elements=[definitions.c.id])
)


def insert_cte(definition: uuid.UUID, workflow: str, graph: str) -> Any:
    """A data-modifying CTE that stores the version (``ON CONFLICT DO NOTHING``), its values
    rendered as literals: added to a process's first autocommit submit of the version, it
    stores the version in the same statement, so the submit costs no extra round trip."""
    const = _executor.const
    return (
        insert(definitions)
        .values(
            id=cast(const(str(definition)), Uuid),
            workflow=const(workflow),
            graph=cast(const(graph), JSONB),
        )
        .on_conflict_do_nothing(index_elements=[definitions.c.id])
        .cte("definition")
    )


_stored: weakref.WeakKeyDictionary[Engine, set[uuid.UUID]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def is_stored(engine: Engine, definition: uuid.UUID) -> bool:
    """Whether this process has committed version ``definition`` in ``engine``'s database."""
    known = _stored.get(engine)
    return known is not None and definition in known


def stored(engine: Engine, definition: uuid.UUID) -> None:
    """Remember that version ``definition`` is committed in ``engine``'s database."""
    with _lock:
        _stored.setdefault(engine, set()).add(definition)


def ensure(engine: Engine, definition: uuid.UUID, workflow: str, graph: str) -> None:
    """Make sure version ``definition`` is stored in ``engine``'s database before a run names it.

    The first call per engine and version inserts it (``ON CONFLICT DO NOTHING``) in
    autocommit, on a pooled connection; every later call is a set lookup. For the forms
    that join a caller's transaction or open one of cyclone's, whose commit is not known
    when the run is inserted.
    """
    if is_stored(engine, definition):
        return
    with _executor.connect(engine) as conn:
        conn.affected(_INSERT, {"id": definition, "workflow": workflow, "graph": graph})
    stored(engine, definition)
