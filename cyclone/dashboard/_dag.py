"""Lay a run's DAG out for an SVG drawn on the server (pure: no SQL, no templates).

Each step goes in the column of its depth (the longest path from a root), and within a
column steps are ordered by the mean row of their upstream steps, which keeps most edges
short and uncrossed for the graphs workflows have.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NODE_WIDTH = 168
NODE_HEIGHT = 40
COLUMN_GAP = 56
ROW_GAP = 18
MARGIN = 12


@dataclass(frozen=True, slots=True)
class Node:
    """A step's box: its name, column, row and top-left corner."""

    name: str
    depth: int
    row: int
    x: int
    y: int


@dataclass(frozen=True, slots=True)
class Edge:
    """An upstream -> downstream arrow as an SVG cubic path."""

    source: str
    target: str
    path: str


@dataclass(frozen=True, slots=True)
class Layout:
    nodes: list[Node]
    edges: list[Edge]
    width: int
    height: int


def depths(after: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Each step's longest distance from a root; unknown upstream names are ignored."""
    depth: dict[str, int] = {}
    visiting: set[str] = set()

    def visit(name: str) -> int:
        if name in depth:
            return depth[name]
        if name in visiting:
            raise ValueError(f"the graph has a cycle through {name!r}")
        visiting.add(name)
        ups = [u for u in after[name] if u in after]
        depth[name] = 1 + max((visit(u) for u in ups), default=-1)
        visiting.discard(name)
        return depth[name]

    for name in after:
        visit(name)
    return depth


def layout(after: Mapping[str, Sequence[str]]) -> Layout:
    """Place the steps of ``after`` (step -> its upstream steps) and route the edges."""
    depth = depths(after)
    columns: dict[int, list[str]] = {}
    for name in after:
        columns.setdefault(depth[name], []).append(name)
    row: dict[str, float] = {}
    for d in sorted(columns):
        names = columns[d]
        if d > 0:
            first = {n: i for i, n in enumerate(names)}
            names.sort(key=lambda n: _mean([row[u] for u in after[n] if u in row], first[n]))
        for i, name in enumerate(names):
            row[name] = i
    nodes = [
        Node(
            name,
            depth[name],
            int(row[name]),
            MARGIN + depth[name] * (NODE_WIDTH + COLUMN_GAP),
            MARGIN + int(row[name]) * (NODE_HEIGHT + ROW_GAP),
        )
        for d in sorted(columns)
        for name in columns[d]
    ]
    at = {n.name: n for n in nodes}
    edges = []
    for node in nodes:
        for upstream in after[node.name]:
            if upstream in at:
                edges.append(Edge(upstream, node.name, _curve(at[upstream], node)))
    width = 2 * MARGIN + (max(columns, default=0) + 1) * (NODE_WIDTH + COLUMN_GAP) - COLUMN_GAP
    rows = max((len(c) for c in columns.values()), default=1)
    height = 2 * MARGIN + rows * (NODE_HEIGHT + ROW_GAP) - ROW_GAP
    return Layout(nodes, edges, width, height)


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _curve(source: Node, target: Node) -> str:
    """A path from the source's right side to the target's left side, around other nodes.

    An edge to the next column is one S-curve through the gap between the columns. A
    longer edge would cross the nodes of the columns between, so it turns into the
    channel between rows above the higher of its two ends, runs along it, and turns
    down to the target in the gap before the target's column.
    """
    x1, y1 = source.x + NODE_WIDTH, source.y + NODE_HEIGHT // 2
    x2, y2 = target.x - 6, target.y + NODE_HEIGHT // 2
    if target.depth - source.depth == 1:
        bend = (x2 - x1) // 2
        return f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}"
    channel = min(source.y, target.y) - ROW_GAP // 2
    gap1, gap2 = x1 + COLUMN_GAP // 2, target.x - COLUMN_GAP // 2
    d = COLUMN_GAP // 4
    return (
        f"M{x1},{y1} C{x1 + d},{y1} {gap1 - d},{channel} {gap1},{channel} L{gap2},{channel}"
        f" C{gap2 + d},{channel} {x2 - d},{y2} {x2},{y2}"
    )
