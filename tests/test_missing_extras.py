"""An optional integration imported without its extra's libraries names the extra to install."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cyclone
from cyclone.errors import MissingExtraError

ROOT = Path(__file__).resolve().parent.parent

# Imports `module` with `blocked` made unimportable (as if it were not installed), and
# prints what was raised.
PROBE = """
import importlib, json, sys
sys.modules[sys.argv[2]] = None
module, _, name = sys.argv[1].partition(":")
try:
    imported = importlib.import_module(module)
    if name.endswith("()"):
        getattr(imported, name[:-2])(None)  # a function that imports its library when called
    elif name:
        getattr(imported, name)
except BaseException as exc:
    import cyclone.errors
    cause = exc.__cause__
    print(json.dumps({
        "type": type(exc).__name__,
        "import_error": isinstance(exc, ImportError),
        "cyclone_error": isinstance(exc, cyclone.errors.CycloneError),
        "name": getattr(exc, "name", None),
        "message": str(exc),
        "cause": None if cause is None else [type(cause).__name__, getattr(cause, "name", None)],
    }))
else:
    print("null")
"""

# (what is imported, the library made unimportable, the extra, the module the error names:
# a package guards the imports of all its modules, each of which imports it first)
CASES = [
    ("cyclone.contrib.flask", "flask", "flask", "cyclone.contrib.flask"),
    ("cyclone.contrib.flask", "click", "flask", "cyclone.contrib.flask"),
    ("cyclone.contrib.otel", "opentelemetry", "otel", "cyclone.contrib.otel"),
    ("cyclone.contrib.django", "django", "django", "cyclone.contrib.django"),
    ("cyclone.contrib.django.apps", "django", "django", "cyclone.contrib.django"),
    ("cyclone.contrib.django.admin", "django", "django", "cyclone.contrib.django"),
    ("cyclone.contrib.django.dashboard", "django", "django", "cyclone.contrib.django"),
    (COMMAND := "cyclone.contrib.django.management.commands.cyclone", "click", "django", COMMAND),
    ("cyclone.dashboard", "jinja2", "dashboard", "cyclone.dashboard"),
    ("cyclone.dashboard", "werkzeug", "dashboard", "cyclone.dashboard"),
    ("cyclone.dashboard.flask", "werkzeug", "dashboard", "cyclone.dashboard"),
    ("cyclone.dashboard:serve()", "waitress", "dashboard", "cyclone.dashboard"),
    ("cyclone.cli:build_cli", "click", "cli", "cyclone.cli"),
]


def probe(module: str, blocked: str) -> dict[str, Any] | None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module, blocked],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] | None = json.loads(done.stdout)
    return found


@pytest.mark.parametrize(("module", "blocked", "extra", "named"), CASES)
def test_an_integration_without_its_library_raises_an_import_error_naming_the_extra(
    module: str, blocked: str, extra: str, named: str
) -> None:
    raised = probe(module, blocked)
    assert raised is not None, f"{module} imported without {blocked}"
    cause_type, cause_name = raised.pop("cause")
    assert raised == {
        "type": "MissingExtraError",
        "import_error": True,
        "cyclone_error": True,
        "name": blocked,
        "message": f"{named} needs the {extra} extra (no module named {blocked!r}): "
        f"pip install 'cyclone[{extra}]'",
    }
    assert cause_type == "ModuleNotFoundError"
    assert str(cause_name).partition(".")[0] == blocked


def test_a_missing_module_of_cyclone_itself_is_not_called_a_missing_extra() -> None:
    with (
        pytest.raises(ModuleNotFoundError) as caught,
        MissingExtraError.guard("cyclone.contrib.x", "x"),
    ):
        importlib.import_module("cyclone._no_such_module")
    assert type(caught.value) is ModuleNotFoundError


def test_the_error_is_a_module_not_found_error_and_a_cyclone_error() -> None:
    error = MissingExtraError(module="cyclone.contrib.flask", missing="flask", extra="flask")
    assert isinstance(error, ModuleNotFoundError)
    assert isinstance(error, cyclone.CycloneError)
    assert error.name == "flask"
    assert str(error) == (
        "cyclone.contrib.flask needs the flask extra (no module named 'flask'): "
        "pip install 'cyclone[flask]'"
    )
