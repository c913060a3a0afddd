"""One read model: the front ends read through ``cyclone.Client`` and send no SQL of their
own, the public modules export no statement builders, and code outside the package uses
the public API only."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import Table
from sqlalchemy.sql import ClauseElement

ROOT = Path(__file__).resolve().parents[1]
FRONT_ENDS = ("cli", "dashboard", "contrib")

SQL_NAMES = {
    "sqlalchemy.text",
    "sqlalchemy.select",
    "sqlalchemy.insert",
    "sqlalchemy.update",
    "sqlalchemy.delete",
    "sqlalchemy.union_all",
    "sqlalchemy.func",
}
SQL_MODULES = ("sqlalchemy.sql", "sqlalchemy.dialects", "cyclone.schema")
STORE_MODULES = {
    "cyclone._store.reads",
    "cyclone._store.counts",
    "cyclone._store.standalone",
    "cyclone._store.executor",
}
SENDS = {"execute", "exec_driver_sql", "scalar", "scalars"}


def front_end_modules() -> list[Path]:
    return sorted(p for d in FRONT_ENDS for p in (ROOT / "cyclone" / d).rglob("*.py"))


def imported_names(tree: ast.AST) -> set[str]:
    """Every ``module.name`` a module imports, and every attribute of an imported module."""
    found: set[str] = set()
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.add(f"{aliases[node.value.id]}.{node.attr}")
    return found


def sql_of(path: Path) -> list[str]:
    """What in a module builds or sends SQL."""
    tree = ast.parse(path.read_text(), str(path))
    problems = [
        name
        for name in sorted(imported_names(tree))
        if name in SQL_NAMES
        or name in STORE_MODULES
        or any(name == m or name.startswith(f"{m}.") for m in SQL_MODULES)
    ]
    problems += [
        f".{node.func.attr}() at line {node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in SENDS
    ]
    return problems


def test_the_front_ends_build_and_send_no_sql() -> None:
    modules = front_end_modules()
    assert len(modules) > 10
    found = {str(p.relative_to(ROOT)): sql_of(p) for p in modules}
    assert {path: problems for path, problems in found.items() if problems} == {}


def test_the_check_finds_a_statement_built_or_sent(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sqlalchemy as sa\nfrom cyclone._store import reads\n"
        "from cyclone.schema import runs\n"
        "def read(conn):\n    return conn.execute(sa.select(runs.c.id)).all()\n"
    )
    assert sql_of(probe) == [
        "cyclone._store.reads",
        "cyclone.schema.runs",
        "sqlalchemy.select",
        ".execute() at line 5",
    ]


@pytest.mark.parametrize("front_end", FRONT_ENDS)
@pytest.mark.parametrize(
    "source",
    [
        "from sqlalchemy import select\n",
        "import sqlalchemy as sa\n\nsa.update\n",
        "from sqlalchemy import text\n",  # a nested banned-api replaces the project's
        "from sqlalchemy.dialects.postgresql import insert\n",
        "from cyclone.schema import runs\n",
        "from cyclone._store import reads\n",
    ],
)
def test_ruff_refuses_sql_in_each_front_end(front_end: str, source: str) -> None:
    def ruff(path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", path, "-"],
            input=f"from __future__ import annotations\n\n{source}",
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )

    refused = ruff(f"cyclone/{front_end}/probe.py")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "TID251" in refused.stdout
    if "text" not in source:  # the store's modules may build statements
        allowed = ruff("cyclone/_store/probe.py")
        assert "TID251" not in allowed.stdout, allowed.stdout


PUBLIC_MODULES = (
    "cyclone.runs",
    "cyclone.jobs",
    "cyclone.client",
    "cyclone.schedules",
    "cyclone.workflow",
    "cyclone.worker",
    "cyclone.connections",
    "cyclone.context",
)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_the_public_modules_export_no_statement_or_column_list(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = {n: getattr(module, n) for n in dir(module) if not n.startswith("_")}
    builders = [n for n, obj in exported.items() if n.endswith("_stmt") and callable(obj)]
    statements = [
        n  # cyclone.schema's tables, imported, are public there
        for n, obj in exported.items()
        if isinstance(obj, ClauseElement) and not isinstance(obj, Table)
    ]
    columns = [
        n
        for n, obj in exported.items()
        if isinstance(obj, tuple) and any(isinstance(c, ClauseElement) for c in obj)
    ]
    decoders = [n for n, obj in exported.items() if n.endswith("_from_row")]
    assert (builders, statements, columns, decoders) == ([], [], [], [])
    for gone in ("STATUS_COLUMNS", "JOB_STATUS_COLUMNS", "cancel_job", "TRANSITIONS"):
        assert not hasattr(module, gone), f"{module_name}.{gone}"


PROFILED = {"cyclone._store.claim", "cyclone._store.notify"}
"""Private modules bench/profile.py wraps to time cyclone's internals themselves."""


def private_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return {
        name
        for name in imported_names(tree)
        if name.startswith("cyclone.")
        and any(part.startswith("_") and not part.startswith("__") for part in name.split("."))
    }


@pytest.mark.parametrize("folder", ["bench", "examples"])
def test_code_outside_the_package_imports_no_private_name(folder: str) -> None:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files
    found = {
        str(p.relative_to(ROOT)): private_imports(p) - PROFILED
        for p in files
        if private_imports(p) - PROFILED
    }
    assert found == {}
