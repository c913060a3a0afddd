"""Hypothesis properties of submit_once's keys and input equivalence, on the private cluster.

"Same input" is jsonb equality, so PostgreSQL itself is the oracle: two inputs give the
same run exactly when ``a::jsonb = b::jsonb``, whatever their key order, whitespace or
``1`` vs ``1.0``; otherwise the second submit conflicts.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import URL

import cyclone
from cyclone.schema import runs
from tests.reliability.conftest import figures
from tests.support import at_rest

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SAFE_INT = 2**53

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-SAFE_INT, SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(st.characters(exclude_characters="\x00", codec="utf-8"), max_size=6),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)

_counts: dict[str, int] = {}


@pytest.fixture(scope="module")
def engine(cluster: Any) -> Iterator[sa.Engine]:
    url: URL = cluster.create_database(f"prop_{uuid.uuid4().hex[:10]}")
    engine = sa.create_engine(url)
    cyclone.upgrade(engine)
    yield engine
    engine.dispose()
    figures("hypothesis_properties", **_counts)


@pytest.fixture(autouse=True)
def _checked_at_rest(engine: sa.Engine) -> None:
    """The module's database is checked at rest after each of its tests."""
    at_rest.touch(engine.url)


def count(what: str) -> None:
    _counts[what] = _counts.get(what, 0) + 1


def any_workflow() -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(f"p{uuid.uuid4().hex[:10]}", input=Any)
    wf.step("only")(lambda ctx, value: None)
    return wf


def equivalent(value: Any, rng: random.Random) -> Any:
    """A jsonb-equal spelling of ``value``: keys reordered, integers written as floats."""
    if isinstance(value, dict):
        items = [(k, equivalent(v, rng)) for k, v in value.items()]
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [equivalent(v, rng) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return float(value)
    return value


def jsonb_equal(engine: sa.Engine, a: Any, b: Any) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text("SELECT CAST(:a AS jsonb) = CAST(:b AS jsonb)"),
                {"a": msgspec.json.encode(a).decode(), "b": msgspec.json.encode(b).decode()},
            ).scalar_one()
        )


@SETTINGS
@given(value=json_values, seed=st.integers(0, 2**32))
@example(value={"a": None, "b": [1, 2.5, {"c": 3}]}, seed=1)  # a null in a Raw spelling
def test_jsonb_equal_inputs_are_the_same_input(engine: sa.Engine, value: Any, seed: int) -> None:
    wf = any_workflow()
    key = f"k-{uuid.uuid4()}"
    first, created = wf.submit_once(engine, key, value)
    assert created
    rng = random.Random(seed)
    reordered = equivalent(value, rng)
    spaced = msgspec.Raw(msgspec.json.format(msgspec.json.encode(reordered), indent=3))
    for spelling in (value, reordered, spaced):
        again, created = wf.submit_once(engine, key, spelling)
        assert (again.id, created) == (first.id, False)
    count("equal_inputs_checked")


@SETTINGS
@given(a=json_values, b=json_values)
def test_inputs_that_are_not_jsonb_equal_conflict(engine: sa.Engine, a: Any, b: Any) -> None:
    wf = any_workflow()
    key = f"k-{uuid.uuid4()}"
    first, _ = wf.submit_once(engine, key, a)
    if jsonb_equal(engine, a, b):
        assert wf.submit_once(engine, key, b) == (first, False)
        count("pairs_equal")
    else:
        with pytest.raises(cyclone.SubmitConflictError) as caught:
            wf.submit_once(engine, key, b)
        assert caught.value.run_id == first.id
        count("pairs_conflicting")


valid_keys = st.text(
    st.characters(exclude_characters="\x00", codec="utf-8"), min_size=1, max_size=256
).filter(lambda k: len(k.encode()) <= 256)


@SETTINGS
@given(key=valid_keys)
def test_valid_keys_round_trip(engine: sa.Engine, key: str) -> None:
    wf = any_workflow()
    run, created = wf.submit_once(engine, key, {"k": key})
    assert created
    assert run.key == key
    with engine.connect() as conn:
        stored = conn.execute(sa.select(runs.c.submit_key).where(runs.c.id == run.id)).scalar_one()
    assert stored == key
    assert run.status().key == key
    assert wf.submit_once(engine, key, {"k": key}) == (run, False)
    count("valid_keys_checked")


invalid_keys = (
    st.just("")
    | st.text(min_size=0, max_size=20).map(lambda s: s + "\x00" + s)
    | st.text(
        st.characters(min_codepoint=0x80, exclude_characters="\x00", codec="utf-8"),
        min_size=129,
        max_size=300,
    ).filter(lambda k: len(k.encode()) > 256)
    | st.sampled_from(["\ud800", "a\udfffb"])
    | st.one_of(st.integers(), st.binary(min_size=1), st.none(), st.floats())
)


@SETTINGS
@given(key=invalid_keys)
def test_invalid_keys_raise_before_any_statement(engine: sa.Engine, key: Any) -> None:
    wf = any_workflow()
    sent: list[str] = []
    checkouts: list[int] = []

    def on_statement(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        sent.append(statement)

    def on_checkout(*args: Any) -> None:
        checkouts.append(1)

    with engine.connect() as conn:
        conn.begin()
        sa.event.listen(engine, "before_cursor_execute", on_statement)
        sa.event.listen(engine.pool, "checkout", on_checkout)
        try:
            with pytest.raises(cyclone.InvalidKeyError):
                wf.submit_once(engine, key, 1)
            with pytest.raises(cyclone.InvalidKeyError):
                wf.submit_once_tx(conn, key, 1)
        finally:
            sa.event.remove(engine, "before_cursor_execute", on_statement)
            sa.event.remove(engine.pool, "checkout", on_checkout)
        conn.rollback()
    assert sent == []
    assert checkouts == []
    count("invalid_keys_checked")
