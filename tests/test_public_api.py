"""The public API: ``cyclone.__all__`` and where its names live."""

from __future__ import annotations

import importlib
import inspect
import pickle
import types
import uuid

import cyclone

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
