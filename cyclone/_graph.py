"""DAG checks and the serialisable graph snapshot a run is submitted with (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta

import msgspec

from cyclone import errors


class NodeSnapshot(msgspec.Struct, frozen=True, omit_defaults=True):
    """One step as the run was submitted with it (``signal``: the signal a wait node awaits;
    ``sleep``: how long a sleep node waits; ``over``: the node a map node maps over, also
    one of its ``after``)."""

    name: str
    after: tuple[str, ...]
    max_attempts: int
    queue: str
    priority: int
    signal: str | None = None
    sleep: timedelta | None = None
    over: str | None = None


class GraphSnapshot(msgspec.Struct, frozen=True):
    """The graph a run keeps for its whole life, whatever later deploys define."""

    steps: tuple[NodeSnapshot, ...]
    result: str | None = None


def topological_order(workflow: str, deps: Mapping[str, Sequence[str]]) -> list[str]:
    """Return the step names roots first, or raise DefinitionError on a cycle or unknown step."""
    for name, after in deps.items():
        for upstream in after:
            if upstream not in deps:
                raise errors.DefinitionError(
                    f"step {name!r} of workflow {workflow!r} comes after unknown step {upstream!r}"
                )
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*path[path.index(name) :], name]
            raise errors.DefinitionError(f"workflow {workflow!r} has a cycle: {' -> '.join(cycle)}")
        state[name] = 1
        for upstream in deps[name]:
            visit(upstream, [*path, name])
        state[name] = 2
        order.append(name)

    for name in deps:
        visit(name, [])
    return order
