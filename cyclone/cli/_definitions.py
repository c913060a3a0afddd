"""Find the workflows and standalone step kinds a worker runs, from ``MODULE[:ATTR]`` names."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from cyclone.cli._db import BadInput, CommandError
from cyclone.workflow import StandaloneStep, Workflow

Definitions = tuple[list[Workflow[Any]], list[StandaloneStep[Any, Any]]]


def load(targets: Sequence[str]) -> Definitions:
    """Import each ``MODULE`` (all it defines) or ``MODULE:ATTR`` (one definition or a list).

    The current directory comes first on ``sys.path``, as for ``python -m``.

    Raises:
        CommandError: a module that cannot be found or defines nothing, an attribute
            that does not exist or holds something else.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    workflows: list[Workflow[Any]] = []
    steps: list[StandaloneStep[Any, Any]] = []
    for target in targets:
        for value in _values(target):
            if isinstance(value, Workflow):
                if value not in workflows:
                    workflows.append(value)
            elif value not in steps:
                steps.append(value)
    return workflows, steps


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(f"{exc.name}.")):
            raise BadInput(
                f"no module named {name!r} (searched the current directory and sys.path)"
            ) from exc
        raise CommandError(f"importing module {name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CommandError(
            f"importing module {name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


def _definition(value: object) -> bool:
    return isinstance(value, Workflow | StandaloneStep)


def _values(target: str) -> list[Workflow[Any] | StandaloneStep[Any, Any]]:
    name, _, attr = target.partition(":")
    if not name:
        raise BadInput(f"{target!r} names no module: write MODULE or MODULE:ATTR")
    module = _import(name)
    if not attr:
        found = [value for value in vars(module).values() if _definition(value)]
        if not found:
            raise BadInput(
                f"module {name!r} defines no workflow or step kind "
                f"(it has no module-level Workflow or StandaloneStep)"
            )
        return found
    try:
        value = getattr(module, attr)
    except AttributeError:
        raise BadInput(f"module {name!r} has no attribute {attr!r}") from None
    if _definition(value):
        return [value]
    if isinstance(value, list | tuple) and value and all(_definition(v) for v in value):
        return list(value)
    raise BadInput(
        f"{target} holds an object of type {type(value).__name__}, "
        "not a workflow, a step kind or a list of them"
    )
