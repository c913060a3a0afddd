"""Find the workflows and standalone step kinds a Django project defines.

By convention each installed app may have a ``workflows`` module; a project that keeps
its definitions elsewhere lists the modules in ``settings.CYCLONE_WORKFLOW_MODULES``.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module
from types import ModuleType
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import module_has_submodule

from cyclone.workflow import StandaloneStep, Workflow

AUTODISCOVER_MODULE = "workflows"


def listed_modules() -> list[str] | None:
    """The module paths of ``settings.CYCLONE_WORKFLOW_MODULES``, None when it is unset.

    Raises:
        ImproperlyConfigured: it is not a list of absolute module paths.
    """
    listed = getattr(settings, "CYCLONE_WORKFLOW_MODULES", None)
    if listed is None:
        return None
    if isinstance(listed, str) or not isinstance(listed, Iterable):
        raise ImproperlyConfigured(
            "settings.CYCLONE_WORKFLOW_MODULES must be a list of module paths, "
            f"got {type(listed).__name__}"
        )
    paths = list(listed)
    for path in paths:
        if not isinstance(path, str) or not path or path.startswith("."):
            raise ImproperlyConfigured(
                f"settings.CYCLONE_WORKFLOW_MODULES must list absolute module paths, got {path!r}"
            )
    return paths


def _modules() -> list[ModuleType]:
    listed = listed_modules()
    if listed is None:
        return [
            import_module(f"{config.name}.{AUTODISCOVER_MODULE}")
            for config in apps.get_app_configs()
            if module_has_submodule(config.module, AUTODISCOVER_MODULE)
        ]
    found = []
    for path in listed:
        try:
            found.append(import_module(path))
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"settings.CYCLONE_WORKFLOW_MODULES: cannot import {path!r}: {exc}"
            ) from exc
    return found


def definitions() -> tuple[list[Workflow[Any]], list[StandaloneStep[Any, Any]]]:
    """The workflows and standalone steps defined at the top level of the project's modules.

    Raises:
        ImproperlyConfigured: a module listed in ``CYCLONE_WORKFLOW_MODULES`` defines
            neither, or two different definitions share a name.
    """
    workflows: dict[str, Workflow[Any]] = {}
    steps: dict[str, StandaloneStep[Any, Any]] = {}
    listed = getattr(settings, "CYCLONE_WORKFLOW_MODULES", None) is not None
    for module in _modules():
        found = 0
        for value in vars(module).values():
            if isinstance(value, Workflow):
                _add(workflows, value.name, value, module)
                found += 1
            elif isinstance(value, StandaloneStep):
                _add(steps, value.kind, value, module)
                found += 1
        if listed and not found:
            raise ImproperlyConfigured(
                f"settings.CYCLONE_WORKFLOW_MODULES: module {module.__name__!r} defines "
                "no cyclone.Workflow and no @cyclone.step"
            )
    return list(workflows.values()), list(steps.values())


def _add(into: dict[str, Any], name: str, value: object, module: ModuleType) -> None:
    if into.get(name, value) is not value:
        raise ImproperlyConfigured(
            f"two cyclone definitions are named {name!r} (the second in {module.__name__})"
        )
    into[name] = value
