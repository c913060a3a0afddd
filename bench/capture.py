"""The SQL cyclone sends, captured through SQLAlchemy's public cursor events.

An engine with a ``before_cursor_execute`` listener runs cyclone's fast-path statements
through a SQLAlchemy ``Connection`` (see README "Performance"), so the listener sees each
statement's text and parameters: the benchmark replays and EXPLAINs them from there,
never through cyclone's private modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa


@contextmanager
def captured(engine: sa.Engine) -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Collect ``(statement, parameters)`` of everything ``engine`` runs meanwhile."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def before(
        conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
    ) -> None:
        seen.append((statement, dict(parameters) if isinstance(parameters, dict) else {}))

    sa.event.listen(engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)


def first(seen: list[tuple[str, dict[str, Any]]], prefix: str) -> tuple[str, dict[str, Any]]:
    """The first captured statement whose text starts with ``prefix``."""
    for statement, parameters in seen:
        if statement.lstrip().startswith(prefix):
            return statement, parameters
    raise LookupError(f"no statement starting with {prefix!r} was captured")


CLAIM = "WITH picked AS"
"""A worker's claim statement, alone."""
RECORD_AND_CLAIM = "WITH locked_runs AS"
"""A worker's claim statement recording successes (``:items``) first."""
CLAIMED_ID, CLAIMED_LEASE = 1, 7
"""Where a claimed job's id and lease are in the claim's rows (the worker's own layout)."""


def items(rows: list[Any]) -> str:
    """The ``items`` parameter recording each claimed row as a success with output null."""
    import json

    return json.dumps(
        [
            {"id": r[CLAIMED_ID], "lease": r[CLAIMED_LEASE], "output": "null"}
            for r in rows
            if r[CLAIMED_ID] is not None
        ]
    )
