"""A held connection (a worker's claim and record) plans its statements again as its tables
grow: a generic plan made when they were nearly empty would scan them whole for ever."""

from __future__ import annotations

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
    read = _executor.Compiled(sa.select(table.c.v).where(table.c.g == sa.bindparam("g")))
    held = _executor.Held(engine)
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

        monkeypatch.setattr(held, "_replan_at", 0.0)  # the next replanning falls due
        assert held.rows(read, {"g": 2}) == [(2,)]
        plan = _cached_plan(held, table)
        assert "Seq Scan" not in plan
        assert f"ix_{table.name}_g" in plan
    finally:
        held.close()


def test_replanning_comes_at_doubling_intervals_up_to_a_minute(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(_executor, "monotonic", lambda: now[0])
    held = _executor.Held(engine)
    one = _executor.Compiled(sa.select(sa.literal(1)))
    discarded: list[float] = []
    try:
        held.rows(one, {})
        monkeypatch.setattr(
            _executor.Direct, "discard_plans", lambda _self: discarded.append(now[0])
        )
        for _ in range(4000):
            now[0] += 0.25
            held.rows(one, {})
    finally:
        held.close()
    gaps = [round(b - a, 2) for a, b in zip([1000.0, *discarded], discarded, strict=False)]
    assert gaps[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert set(gaps[7:]) == {60.0}
