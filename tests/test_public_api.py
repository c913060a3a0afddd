"""The public API: ``cyclone.__all__`` and where its names live."""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
import types
import uuid
from pathlib import Path

import cyclone
from tests.support import docs, processes

EXPECTED = [
    "Client",
    "Concurrency",
    "CycloneError",
    "DefinitionError",
    "DuplicateError",
    "InputError",
    "InvalidKeyError",
    "InvalidStateError",
    "Job",
    "JobState",
    "JobStatus",
    "NoOutputError",
    "NotFoundError",
    "Parked",
    "Rate",
    "ResultRun",
    "ResultWorkflow",
    "Run",
    "RunFailedError",
    "RunState",
    "RunStatus",
    "Schedule",
    "ScheduleStatus",
    "SchemaError",
    "StandaloneStep",
    "Step",
    "StepContext",
    "SubmitConflictError",
    "TransactionAbortedError",
    "Worker",
    "WorkerStats",
    "WorkerStatus",
    "Workflow",
    "__version__",
    "check_schema",
    "close",
    "configure",
    "downgrade",
    "errors",
    "step",
    "upgrade",
]


def public_objects() -> dict[str, object]:
    return {name: getattr(cyclone, name) for name in cyclone.__all__ if name != "__version__"}


def test_all_is_sorted_and_unique() -> None:
    assert list(cyclone.__all__) == sorted(cyclone.__all__)
    assert len(set(cyclone.__all__)) == len(cyclone.__all__)


def test_every_name_in_all_resolves() -> None:
    for name in cyclone.__all__:
        assert hasattr(cyclone, name), name
    namespace: dict[str, object] = {}
    exec("from cyclone import *", namespace)
    assert set(cyclone.__all__) <= set(namespace)


def test_no_private_names_except_version() -> None:
    private = [name for name in cyclone.__all__ if name.startswith("_")]
    assert private == ["__version__"]
    assert isinstance(cyclone.__version__, str)
    assert cyclone.__version__


def test_every_object_lives_in_a_public_cyclone_module() -> None:
    for name, obj in public_objects().items():
        is_module = isinstance(obj, types.ModuleType)
        module: str = obj.__name__ if is_module else obj.__module__  # type: ignore[attr-defined]
        parts = module.split(".")
        assert parts[0] == "cyclone", (name, module)
        assert not any(part.startswith("_") for part in parts), (name, module)
        importlib.import_module(module)


def test_the_spec_names_are_exported() -> None:
    """The names SPEC.md fixes, plus the errors it lists, are all public."""
    spec = {
        "Workflow",
        "ResultWorkflow",
        "StepContext",
        "step",
        "Run",
        "ResultRun",
        "RunStatus",
        "RunState",
        "Client",
        "Job",
        "Worker",
        "upgrade",
        "CycloneError",
        "InvalidKeyError",
        "SubmitConflictError",
        "DuplicateError",
        "NoOutputError",
        "RunFailedError",
        "InputError",
        "DefinitionError",
    }
    assert spec <= set(cyclone.__all__)


def test_all_snapshot() -> None:
    """Adding or removing a public name is a decision: update this list with it."""
    assert cyclone.__all__ == EXPECTED


def test_errors_form_one_hierarchy() -> None:
    for name, obj in public_objects().items():
        if inspect.isclass(obj) and issubclass(obj, Exception):
            assert issubclass(obj, cyclone.CycloneError), name
            assert obj.__module__ == "cyclone.errors", name
            assert getattr(cyclone.errors, name) is obj
    assert issubclass(cyclone.InvalidKeyError, ValueError)
    assert issubclass(cyclone.NotFoundError, LookupError)


def test_errors_keep_their_attributes_when_pickled() -> None:
    run_id = uuid.uuid4()
    error = cyclone.SubmitConflictError(workflow="w", key="k", run_id=run_id)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is cyclone.SubmitConflictError
    assert (copy.workflow, copy.key, copy.run_id) == ("w", "k", run_id)
    assert str(copy) == str(error)


USER_PROGRAM = """
from __future__ import annotations

from typing import Any, assert_type

import msgspec
import sqlalchemy as sa

import cyclone


class Order(msgspec.Struct):
    order_id: str


class Quote(msgspec.Struct):
    cents: int


checkout = cyclone.Workflow("checkout", input=Order)
pricing = cyclone.ResultWorkflow("pricing", input=Order, output=Quote)
loose = cyclone.Workflow("loose")
only_output = cyclone.ResultWorkflow("only-output", output=int)
assert_type(checkout, cyclone.Workflow[Order])
assert_type(pricing, cyclone.ResultWorkflow[Order, Quote])
assert_type(loose, cyclone.Workflow[Any])
assert_type(only_output, cyclone.ResultWorkflow[Any, int])


@pricing.result()
def quote(ctx: cyclone.StepContext, order: Order) -> Quote:
    return Quote(len(order.order_id))


def price(engine: sa.Engine) -> Quote:
    run, created = pricing.submit_once(engine, "order:1", Order("1"))
    assert_type(run, cyclone.ResultRun[Quote])
    return run.result(timeout=5)
"""


def test_the_readmes_definitions_type_check_under_mypy_strict(tmp_path: Path) -> None:
    """The README's ``cyclone.Workflow("checkout", input=Order)``, type-checked with the
    package's own annotations (py.typed) as a user's program is: mypy --strict infers the
    input and output types, so the definition needs no annotation and ``result()`` is typed.
    (Before, mypy could not infer them and asked for an annotation of every workflow.)"""
    program = tmp_path / "user_program.py"
    program.write_text(USER_PROGRAM)
    done = processes.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--config-file",
            os.devnull,
            str(program),
        ],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(docs.ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
