"""A held connection (a worker's claim and record) plans its statements again as its tables
grow: a generic plan made when they were nearly empty would scan them whole for ever."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from cyclone._store import executor as _executor


@pytest.fixture
def table(engine: sa.Engine, name: str) -> Iterator[sa.Table]:
    """An empty, analyzed table with an index on ``g``, which autovacuum leaves alone (its
    ANALYZE would make the plans again on its own)."""
    metadata = sa.MetaData()
    made = sa.Table(
        f"{name}_rows",
        metadata,
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("g", sa.Integer, nullable=False, index=True),
        sa.Column("v", sa.Integer, nullable=False),
        postgresql_with={"autovacuum_enabled": "false"},
    )
    metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(sa.text(f'ANALYZE "{made.name}"'))
    try:
        yield made
    finally:
        metadata.drop_all(engine)


def _cached_plan(held: _executor.Held, table: sa.Table) -> str:
    """The plan the held session keeps for its prepared read of ``table``."""
    direct = held._ready()
    driver = direct._driver
    row = driver.execute(
        "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
        (f"%FROM {table.name} %",),
    ).fetchone()
    assert row is not None, "the read was not prepared"
    lines = driver.execute(f"EXPLAIN EXECUTE {row[0]}(1)").fetchall()
    return "\n".join(line[0] for line in lines)


def test_a_held_connection_plans_its_statements_again_once_its_tables_have_grown(
    engine: sa.Engine, table: sa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_executor, "REPLAN_FIRST", 3600.0)
    monkeypatch.setattr(_executor, "REPLAN_STATEMENTS_FIRST", 10**9)
    read = _executor.Compiled(sa.select(table.c.v).where(table.c.g == sa.bindparam("g")))
    held = _executor.Held(engine, sized=(table,))
    try:
        assert held.rows(read, {"g": 1}) == []
        assert "Seq Scan" in _cached_plan(held, table)
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f'INSERT INTO "{table.name}" (id, g, v) '
                    "SELECT i, i, i FROM generate_series(1, 100000) AS i"
                )
            )
        # PostgreSQL keeps the plan it made for the empty table: no ANALYZE has run.
        assert "Seq Scan" in _cached_plan(held, table)
        assert held.rows(read, {"g": 1}) == [(1,)]
        assert "Seq Scan" in _cached_plan(held, table)

        monkeypatch.setattr(held, "_replan_at", 0.0)  # the next look at the table falls due
        assert held.rows(read, {"g": 2}) == [(2,)]
        plan = _cached_plan(held, table)
        assert "Seq Scan" not in plan
        assert f"ix_{table.name}_g" in plan
    finally:
        held.close()


def _looks(
    engine: sa.Engine,
    tables: tuple[sa.Table, ...],
    monkeypatch: pytest.MonkeyPatch,
    grown: dict[float, tuple[int, ...]],
    steps: int,
) -> tuple[list[float], list[float]]:
    """When a held connection on ``tables`` looked at their sizes and discarded its plans,
    its statements run every quarter second of a fake clock from 1000.0, the sizes (all 0
    unless ``grown`` gives them at 1000.0) changing at the times in ``grown``."""
    now = [1000.0]
    monkeypatch.setattr(_executor, "monotonic", lambda: now[0])
    discarded: list[float] = []
    monkeypatch.setattr(_executor.Direct, "discard_plans", lambda _self: discarded.append(now[0]))
    looked: list[float] = []
    size = [grown.get(now[0], tuple(0 for _ in tables))]
    real_rows = _executor.Direct.rows

    def rows(self: _executor.Direct, stmt: object, params: object = None) -> list[tuple[int, ...]]:
        if "pg_relation_size" in str(getattr(stmt, "sql", "")):
            looked.append(now[0])
            return [size[0]]
        return real_rows(self, stmt, params)  # type: ignore[arg-type]

    monkeypatch.setattr(_executor.Direct, "rows", rows)
    held = _executor.Held(engine, sized=tables)
    one = _executor.Compiled(sa.select(sa.literal(1)))
    try:
        for _ in range(steps):
            held.rows(one, {})
            now[0] += 0.25
            size[0] = grown.get(now[0], size[0])
    finally:
        held.close()
    return looked, discarded


def test_plans_are_made_again_only_when_the_tables_grew_fourfold_looked_at_doubling_intervals(
    engine: sa.Engine, table: sa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_executor, "REPLAN_FIRST", 1.0)
    monkeypatch.setattr(_executor, "REPLAN_STATEMENTS_FIRST", 10**9)
    grown = {1010.0: (40_000,), 1020.0: (70_000,), 1050.0: (250_000,), 1500.0: (4_000_000,)}
    looked, discarded = _looks(engine, (table,), monkeypatch, grown, 4000)
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(looked)]
    assert looked[0] == 1000.0  # when the connection opened: the size its plans were made for
    assert gaps[:8] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    # 40 kB is not four times the 16 kB floor; 70 kB is; 250 kB is not four times 70 kB,
    # 4 MB is.
    assert discarded == [1031.0, 1543.0]


def test_a_held_connection_also_looks_after_doubling_counts_of_statements(
    engine: sa.Engine, table: sa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker on a new deployment fills its jobs table within its first statements,
    before the clock's first look: it also looks after 4, 8, 16, ... statements."""
    monkeypatch.setattr(_executor, "REPLAN_FIRST", 3600.0)
    grown = {1002.0: (100_000,), 1010.0: (500_000,)}
    looked, discarded = _looks(engine, (table,), monkeypatch, grown, 130)
    # A statement every quarter second, the first opening the connection: it looks 4
    # statements later, then 8, 16, 32 and 64 statements after that.
    assert looked == [1000.0, 1001.0, 1003.0, 1007.0, 1015.0, 1031.0]
    assert discarded == [1003.0, 1015.0]


def test_a_small_table_grown_fourfold_is_planned_again_beside_a_large_one_that_did_not_grow(
    engine: sa.Engine, table: sa.Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's jobs start empty beside a large table of runs: their sum hardly grows."""
    monkeypatch.setattr(_executor, "REPLAN_FIRST", 1.0)
    monkeypatch.setattr(_executor, "REPLAN_STATEMENTS_FIRST", 10**9)
    grown = {1000.0: (0, 4_000_000), 1002.0: (300_000, 4_100_000)}
    _looked, discarded = _looks(engine, (table, table), monkeypatch, grown, 40)
    assert discarded == [1003.0]
