"""The server-side DAG layout: columns by depth, rows ordered by upstream, edges around nodes."""

from __future__ import annotations

import re

import pytest

from cyclone.dashboard import _dag


def test_each_step_sits_in_the_column_of_its_longest_path_from_a_root() -> None:
    layout = _dag.layout({"a": [], "b": ["a"], "c": ["b"], "d": ["a", "c"], "e": []})
    depth = {n.name: n.depth for n in layout.nodes}
    assert depth == {"a": 0, "e": 0, "b": 1, "c": 2, "d": 3}
    x = {n.name: n.x for n in layout.nodes}
    assert x["a"] == x["e"] < x["b"] < x["c"] < x["d"]
    assert layout.width >= x["d"] + _dag.NODE_WIDTH


def test_rows_follow_the_mean_row_of_the_upstream_steps() -> None:
    layout = _dag.layout(
        {"top": [], "bottom": [], "under_bottom": ["bottom"], "under_top": ["top"]}
    )
    row = {n.name: n.row for n in layout.nodes}
    assert row["top"] == row["under_top"] == 0
    assert row["bottom"] == row["under_bottom"] == 1


def test_an_edge_to_the_next_column_is_one_curve_and_a_longer_one_runs_between_rows() -> None:
    layout = _dag.layout({"a": [], "b": ["a"], "c": ["a", "b"]})
    paths = {(e.source, e.target): e.path for e in layout.edges}
    assert set(paths) == {("a", "b"), ("a", "c"), ("b", "c")}
    assert " L" not in paths[("a", "b")]
    long = paths[("a", "c")]
    assert " L" in long
    ys = {int(y) for y in re.findall(r",(-?\d+)", long)}
    nodes_top = min(n.y for n in layout.nodes)
    assert min(ys) < nodes_top  # the channel above the nodes' row, not through b
    assert min(ys) >= 0  # and inside the picture


def test_upstream_names_outside_the_graph_are_ignored_and_cycles_refused() -> None:
    layout = _dag.layout({"a": ["gone"], "b": ["a"]})
    assert [(e.source, e.target) for e in layout.edges] == [("a", "b")]
    with pytest.raises(ValueError, match="cycle"):
        _dag.layout({"a": ["b"], "b": ["a"]})
