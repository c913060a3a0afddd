"""The state machines in one table: every guarded UPDATE is tied to its edges, and back.

``cyclone._store.transitions.BUILDERS`` names, for each edge of ``cyclone.states.EDGES``,
the one statement builder of the store that takes it. Here each statement's SQL must guard
on every source state of its edges and set each target, every edge must have exactly one
builder, and every statement of the store that sets a state must be one of them.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from cyclone._store import claim as _claim
from cyclone._store import executor as _executor
from cyclone._store.transitions import BUILDERS, OWNERS
from cyclone.states import EDGES, Edge


def implemented() -> list[tuple[str, Any, Edge]]:
    found = []
    for key, build in BUILDERS.items():
        assert key in EDGES, f"transitions names an unknown edge {key!r}"
        found.append((f"{build.__module__}.{build.__qualname__}", build, EDGES[key]))
    return found


def sql_of(build: Any) -> str:
    return " ".join(_executor.Compiled(build()).sql.split())


def updates_of(sql: str, table: str) -> list[str]:
    """The text of each ``UPDATE table ...`` in the statement, up to its RETURNING or end."""
    parts = re.split(r"(?=UPDATE )", sql)
    return [p for p in parts if p.startswith(f"UPDATE {table} ")]


def assigned_states(update: str) -> set[str]:
    """The state literals (``'x'`` or ``E'x'``) an UPDATE's ``state=`` assignment can set."""
    match = re.search(r"(?:SET |, )state=(CASE .*? END|E?'\w+')", update)
    return set(re.findall(r"E?'(\w+)'", match.group(1))) if match else set()


def guards(update: str, column: str, state: str) -> bool:
    literal = rf"E?'{re.escape(state)}'"
    equal = re.search(rf"{re.escape(column)} = {literal}", update)
    listed = re.search(rf"{re.escape(column)} IN \([^)]*{literal}", update)
    return bool(equal or listed)


@pytest.mark.parametrize(
    ("owner", "build", "edge"),
    implemented(),
    ids=[f"{o}:{e.key}" for o, _, e in implemented()],
)
def test_each_guarded_update_guards_on_its_edges_sources_and_sets_its_target(
    owner: str, build: Any, edge: Edge
) -> None:
    table = "cyclone_runs" if edge.machine == "run" else "cyclone_jobs"
    sql = sql_of(build)
    candidates = [u for u in updates_of(sql, table) if edge.target in assigned_states(u)]
    assert candidates, f"{owner} sets no {table}.state to {edge.target!r} for {edge.key}"
    # The claim guards its rows in the CTE that picks (and locks) them.
    guarded_text = sql if edge.key == "job.claim" else " ".join(candidates)
    for source in edge.sources:
        assert guards(guarded_text, f"{table}.state", source), (
            f"{owner}: {edge.key} does not guard on state {source!r}"
        )


def test_every_edge_is_implemented_by_exactly_one_builder() -> None:
    assert sorted(BUILDERS) == sorted(EDGES)
    assert len({edge.key for _, _, edge in implemented()}) == len(implemented())


def test_every_update_of_a_state_in_the_owners_is_tied_to_an_edge() -> None:
    tied = set(BUILDERS.values())
    for module in OWNERS:
        for name in dir(module):
            if name.endswith("_stmt") and callable(getattr(module, name)):
                build = getattr(module, name)
                try:
                    sql = sql_of(build)
                except TypeError:
                    continue  # a builder with parameters: registered through a lambda
                sets_state = re.search(r"UPDATE cyclone_(runs|jobs) SET (.*?)state=", sql)
                if sets_state and " state=" in f" {sql.split(' SET ', 1)[1]}":
                    assert build in tied or name in {"claim_jobs_stmt"}, (
                        f"{module.__name__}.{name} changes a state but names no edge"
                    )


@pytest.mark.parametrize("completing", [False, True])
@pytest.mark.parametrize(
    "scope",
    [
        _claim.Scope(queues=None, workflows=("w",), kinds=()),
        _claim.Scope(queues=("q",), workflows=(), kinds=("k",)),
    ],
)
def test_a_claim_for_any_limit_is_the_statement_compiled_for_that_limit(
    scope: _claim.Scope, completing: bool
) -> None:
    for limit in (1, 4, 7, 12, 48, 256):
        compiled = _executor.Compiled(_claim.claim_jobs_stmt(scope, limit, completing=completing))
        fast = _claim._fast_claim(scope, completing, limit)
        assert (fast.sql, fast.defaults) == (compiled.sql, compiled.defaults)
