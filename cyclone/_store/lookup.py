"""Find runs by key or by id: the one-statement reads behind ``get_run``, ``run`` and
``Client.get_run_by_key``.

Each is a single ``SELECT`` on ``cyclone_runs``: by ``(workflow, submit_key)`` it reads the
unique index ``idx_runs_submit_key``, by id the primary key. The bind forms send it in
autocommit on a pooled connection; the ``_tx`` form joins the caller's transaction, so
it sees a run that transaction submitted and has not committed.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Text, bindparam, select

from cyclone import _keys, errors
from cyclone._store import binds as _binds
from cyclone._store import executor as _executor
from cyclone._store import reads as _reads
from cyclone.runs import RunStatus
from cyclone.schema import runs

_BY_KEY = select(runs.c.id).where(
    runs.c.workflow == bindparam("workflow", type_=Text),
    runs.c.submit_key == bindparam("key", type_=Text),
)
_BY_ID = select(runs.c.workflow, runs.c.submit_key).where(runs.c.id == bindparam("rid"))
_STATUS_BY_KEY = select(*_reads.STATUS_COLUMNS).where(
    runs.c.workflow == bindparam("workflow", type_=Text),
    runs.c.submit_key == bindparam("key", type_=Text),
)
_FAST_BY_KEY = _executor.Compiled(_BY_KEY)
_FAST_BY_ID = _executor.Compiled(_BY_ID)
_FAST_STATUS_BY_KEY = _executor.Compiled(_STATUS_BY_KEY)


def run_id_by_key(bind: _binds.Bind, workflow: str, key: str) -> uuid.UUID | None:
    """The id of the run of ``(workflow, key)``, or None; one autocommit statement."""
    _keys.check_key(key)
    rows = _executor.pooled_rows(
        _binds.engine_of(bind), _FAST_BY_KEY, {"workflow": workflow, "key": key}
    )
    return rows[0][0] if rows else None


def run_id_by_key_tx(executor: _executor.Executor, workflow: str, key: str) -> uuid.UUID | None:
    """The id of the run of ``(workflow, key)`` as the caller's transaction sees it."""
    _keys.check_key(key)
    rows = executor.rows(_FAST_BY_KEY, {"workflow": workflow, "key": key})
    return rows[0][0] if rows else None


def as_run_id(run_id: object) -> uuid.UUID:
    """A run id from a UUID or its text; a ValueError for anything else."""
    if isinstance(run_id, uuid.UUID):
        return run_id
    if isinstance(run_id, str):
        return uuid.UUID(run_id)
    raise TypeError(f"a run id is a uuid.UUID or its str, not {type(run_id).__name__}")


def key_of_run(bind: _binds.Bind, workflow: str, run_id: object) -> tuple[uuid.UUID, str | None]:
    """The id and key of run ``run_id`` of ``workflow``.

    Raises:
        NotFoundError: no such run, or it belongs to another workflow.
    """
    rid = as_run_id(run_id)
    rows = _executor.pooled_rows(_binds.engine_of(bind), _FAST_BY_ID, {"rid": rid})
    if not rows:
        raise errors.NotFoundError(f"run {rid} does not exist (purged, or not committed)")
    found_workflow, key = rows[0]
    if found_workflow != workflow:
        raise errors.NotFoundError(
            f"run {rid} belongs to workflow {found_workflow!r}, not to {workflow!r}"
        )
    return rid, key


def status_by_key(bind: _binds.Bind, workflow: str, key: str) -> RunStatus | None:
    """The status of the run of ``(workflow, key)``, or None; one autocommit statement."""
    _keys.check_key(key)
    rows: list[Any] = _executor.pooled_rows(
        _binds.engine_of(bind), _FAST_STATUS_BY_KEY, {"workflow": workflow, "key": key}
    )
    return RunStatus(*_reads.run_status_fields(rows[0])) if rows else None
