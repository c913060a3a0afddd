"""Key rules: checked by cyclone before anything is sent to the database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone import _keys
from cyclone.schema import runs
from tests.conftest import StatementCounter

BAD_KEYS: list[Any] = [
    pytest.param("", id="empty"),
    pytest.param("a\ud800b", id="lone-surrogate"),
    pytest.param("a\x00b", id="nul"),
    pytest.param("x" * 257, id="257-ascii-bytes"),
    pytest.param("é" * 128 + "x", id="257-bytes-multibyte"),
    pytest.param(b"order:1", id="bytes"),
    pytest.param(42, id="int"),
    pytest.param(None, id="none"),
]
# unique=None means "no unique key", so it is not a bad key there.
BAD_UNIQUE_KEYS = BAD_KEYS[:-1]


@pytest.fixture
def checkouts(engine: sa.Engine) -> Iterator[list[object]]:
    """Every connection checked out of the engine's pool: no checkout, no database contact."""
    seen: list[object] = []

    def on_checkout(dbapi_conn: object, record: object, proxy: object) -> None:
        seen.append(dbapi_conn)

    sa.event.listen(engine.pool, "checkout", on_checkout)
    yield seen
    sa.event.remove(engine.pool, "checkout", on_checkout)


def make_workflow(name: str) -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    return wf


def test_a_key_may_be_256_bytes_of_multibyte_characters() -> None:
    key = "é" * 128
    assert len(key.encode("utf-8")) == 256
    assert _keys.check_key(key) == key
    assert _keys.check_key("€" * 85 + "x") == "€" * 85 + "x"  # 255 + 1 bytes


def test_a_key_may_be_256_ascii_bytes() -> None:
    assert _keys.check_key("k" * 256) == "k" * 256


def test_a_key_of_any_valid_unicode_is_accepted() -> None:
    for key in ("a", " ", "order:1", "日本語", "🦀" * 64, "\\u0000"):
        assert _keys.check_key(key) == key


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_bad_key_raises_invalid_key_error(key: object) -> None:
    with pytest.raises(cyclone.InvalidKeyError) as info:
        _keys.check_key(key)
    assert info.value.key == key
    assert info.value.reason


def test_invalid_key_error_is_a_value_error_and_a_cyclone_error() -> None:
    assert issubclass(cyclone.InvalidKeyError, ValueError)
    assert issubclass(cyclone.InvalidKeyError, cyclone.CycloneError)
    with pytest.raises(ValueError, match="must not be empty"):
        _keys.check_key("")


@pytest.mark.parametrize("key", BAD_KEYS)
def test_submit_once_with_a_bad_key_sends_nothing(
    engine: sa.Engine,
    name: str,
    statements: StatementCounter,
    checkouts: list[object],
    key: object,
) -> None:
    wf = make_workflow(name)
    statements.reset()
    with pytest.raises(cyclone.InvalidKeyError):
        wf.submit_once(engine, key, 1)  # type: ignore[arg-type]
    assert statements.count == 0
    assert checkouts == []


@pytest.mark.parametrize("key", BAD_KEYS)
def test_submit_once_tx_with_a_bad_key_sends_nothing(
    engine: sa.Engine, name: str, statements: StatementCounter, key: object
) -> None:
    wf = make_workflow(name)
    with engine.connect() as conn, conn.begin():
        statements.reset()
        with pytest.raises(cyclone.InvalidKeyError):
            wf.submit_once_tx(conn, key, 1)  # type: ignore[arg-type]
        assert statements.count == 0


@pytest.mark.parametrize("key", BAD_KEYS)
def test_submit_once_many_with_a_bad_key_sends_nothing(
    engine: sa.Engine,
    name: str,
    statements: StatementCounter,
    checkouts: list[object],
    key: object,
) -> None:
    wf = make_workflow(name)
    statements.reset()
    with pytest.raises(cyclone.InvalidKeyError):
        wf.submit_once_many(engine, [("good:1", 1), (key, 2), ("good:2", 3)])  # type: ignore[list-item]
    assert statements.count == 0
    assert checkouts == []
    with engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).where(runs.c.workflow == name)).scalar_one()
    assert count == 0


@pytest.mark.parametrize("key", BAD_UNIQUE_KEYS)
def test_enqueue_with_a_bad_unique_key_sends_nothing(
    engine: sa.Engine,
    name: str,
    statements: StatementCounter,
    checkouts: list[object],
    key: object,
) -> None:
    @cyclone.step(name)
    def kind(ctx: cyclone.StepContext, args: int) -> None:
        return None

    statements.reset()
    with pytest.raises(cyclone.InvalidKeyError):
        kind.enqueue(engine, 1, unique=key)  # type: ignore[arg-type]
    assert checkouts == []
    with engine.connect() as conn, conn.begin():
        with pytest.raises(cyclone.InvalidKeyError):
            kind.enqueue_tx(conn, 1, unique=key)  # type: ignore[arg-type]
        assert statements.count == 0
