"""Input encoding: a bad input raises cyclone.InputError before anything is written."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

import cyclone
from cyclone import _codec
from cyclone.schema import runs
from tests.conftest import StatementCounter


class Order(msgspec.Struct):
    id: int
    amount: int


@dataclasses.dataclass
class OrderDC:
    id: int
    amount: int


def order_workflow(name: str) -> cyclone.Workflow[Order]:
    wf: cyclone.Workflow[Order] = cyclone.Workflow(name, input=Order)

    @wf.step()
    def only(ctx: cyclone.StepContext, order: Order) -> None:
        return None

    return wf


def any_workflow(name: str) -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    return wf


def count_runs(engine: sa.Engine, name: str) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).where(runs.c.workflow == name)).scalar_one()


UNENCODABLE: list[Any] = [
    pytest.param(object(), id="object"),
    pytest.param({object(), object()}, id="set-of-objects"),
    pytest.param({"when": object()}, id="nested-object"),
    pytest.param({1j}, id="set-of-complex"),
]

WITH_NUL: list[Any] = [
    pytest.param("a\x00b", id="str"),
    pytest.param({"note": "x\x00"}, id="value"),
    pytest.param({"k\x00": 1}, id="object-key"),
    pytest.param(["ok", ["deep\x00"]], id="nested"),
]

WRONG_TYPE: list[Any] = [
    pytest.param(1, id="int"),
    pytest.param({"id": 1}, id="dict-missing-field"),
    pytest.param({"id": "1", "amount": 2}, id="dict-wrong-field-type"),
    pytest.param([1, 2], id="list"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("value", UNENCODABLE)
def test_an_input_msgspec_cannot_encode_raises_input_error(value: Any) -> None:
    with pytest.raises(cyclone.InputError, match="cannot be encoded"):
        _codec.encode(value, what="input")


@pytest.mark.parametrize("value", WITH_NUL)
def test_an_input_with_nul_raises_input_error(value: Any) -> None:
    with pytest.raises(cyclone.InputError, match="NUL"):
        _codec.encode(value, what="input")


def test_an_escaped_backslash_before_u0000_is_not_a_nul() -> None:
    text = "a\\u0000b"  # a backslash, then the letters u0000: no NUL character
    assert _codec.decode(_codec.encode(text, what="input")) == text
    assert _codec.decode(_codec.encode("\\\\u0000", what="input")) == "\\\\u0000"
    with pytest.raises(cyclone.InputError, match="NUL"):
        _codec.encode("\\\x00", what="input")


@pytest.mark.parametrize("value", WRONG_TYPE)
def test_an_input_not_matching_the_declared_type_raises_input_error(value: Any) -> None:
    with pytest.raises(cyclone.InputError, match="does not match the declared type"):
        _codec.encode(value, what="input", type_=Order)


def test_input_error_is_a_type_error_and_a_cyclone_error() -> None:
    assert issubclass(cyclone.InputError, TypeError)
    assert issubclass(cyclone.InputError, cyclone.CycloneError)
    error = cyclone.InputError(what="input of workflow 'w'", reason="bad")
    assert "input of workflow 'w'" in str(error)


def test_a_struct_a_dataclass_and_a_dict_encode_to_the_same_json() -> None:
    struct = _codec.encode(Order(id=1, amount=2), what="input", type_=Order)
    dc = _codec.encode(OrderDC(id=1, amount=2), what="input", type_=Order)
    mapping = _codec.encode({"amount": 2, "id": 1}, what="input", type_=Order)
    assert struct == dc == mapping == '{"amount":2,"id":1}'


def test_decode_returns_the_declared_type() -> None:
    assert _codec.decode('{"id":1,"amount":2}', Order) == Order(1, 2)
    assert _codec.decode(b"[1,2]") == [1, 2]


@pytest.mark.parametrize("value", [*UNENCODABLE, *WITH_NUL])
def test_submit_with_a_bad_input_writes_nothing(
    engine: sa.Engine, name: str, statements: StatementCounter, value: Any
) -> None:
    wf = any_workflow(name)
    statements.reset()
    with pytest.raises(cyclone.InputError):
        wf.submit(engine, value)
    with pytest.raises(cyclone.InputError):
        wf.submit_once(engine, "k", value)
    with pytest.raises(cyclone.InputError):
        wf.submit_once_many(engine, [("a", 1), ("b", value)])
    with engine.connect() as conn, conn.begin():
        with pytest.raises(cyclone.InputError):
            wf.submit_tx(conn, value)
        with pytest.raises(cyclone.InputError):
            wf.submit_once_tx(conn, "k", value)
    assert statements.count == 0
    assert count_runs(engine, name) == 0


@pytest.mark.parametrize("value", WRONG_TYPE)
def test_submit_with_an_input_not_matching_the_declared_type_writes_nothing(
    engine: sa.Engine, name: str, statements: StatementCounter, value: Any
) -> None:
    wf = order_workflow(name)
    statements.reset()
    with pytest.raises(cyclone.InputError, match="does not match the declared type"):
        wf.submit_once(engine, "k", value)
    with pytest.raises(cyclone.InputError, match="does not match the declared type"):
        wf.submit(engine, value)
    with pytest.raises(cyclone.InputError, match="does not match the declared type"):
        wf.submit_once_many(engine, [("a", Order(1, 2)), ("b", value)])
    assert statements.count == 0
    assert count_runs(engine, name) == 0


def test_submit_accepts_a_dict_that_matches_the_declared_type(engine: sa.Engine, name: str) -> None:
    wf = order_workflow(name)
    run, created = wf.submit_once(engine, "k", {"id": 1, "amount": 2})  # type: ignore[arg-type]
    assert created
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(sa.cast(runs.c.input, sa.Text)).where(runs.c.id == run.id)
        ).scalar_one()
    assert msgspec.json.decode(stored, type=Order) == Order(1, 2)


def test_enqueue_with_bad_args_writes_nothing(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    @cyclone.step(name)
    def kind(ctx: cyclone.StepContext, order: Order) -> None:
        return None

    statements.reset()
    for value in (object(), "nul\x00", {"id": 1}):
        with pytest.raises(cyclone.InputError):
            kind.enqueue(engine, value)  # type: ignore[arg-type]
    assert statements.count == 0
