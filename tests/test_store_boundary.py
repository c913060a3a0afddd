"""One store: every statement against cyclone's tables is built and sent in ``cyclone/_store/``.

No module of the package outside the store (schema.py and migrations.py hold the DDL)
imports SQLAlchemy's statement builders or cyclone's tables, or sends a statement on a
connection or cursor: it calls the store's functions. A ruff rule (TID251, the project's
banned-api, lifted by ``cyclone/_store/ruff.toml``) refuses the imports; this test scans
for the sends, which no import rule can see. Inside the store, every statement is sent
through the executor protocol (``cyclone/_store/executor.py``): no other store module
calls a connection's or cursor's ``execute``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cyclone"
STORE = PACKAGE / "_store"
DDL = {PACKAGE / "schema.py", PACKAGE / "migrations.py"}

SENDS = {"execute", "exec_driver_sql", "executemany", "scalar", "scalars", "cursor"}
BUILDERS = {"select", "insert", "update", "delete", "text", "union_all"}
TABLES = {"runs", "jobs", "signals", "schedules", "leader"}


def outside_the_store() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if STORE not in p.parents and p not in DDL)


def cyclone_names(tree: ast.AST) -> set[str]:
    """The names a module binds by importing from cyclone: calls on them are the store's."""
    return {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cyclone")
        for alias in node.names
    }


def statements_of(path: Path) -> list[str]:
    """What in a module builds or sends a statement."""
    tree = ast.parse(path.read_text(), str(path))
    ours = cyclone_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = node.module
            for alias in node.names:
                if (module.startswith("sqlalchemy") and alias.name in BUILDERS) or (
                    module == "cyclone.schema" and alias.name in TABLES
                ):
                    found.append(f"imports {module}.{alias.name} at line {node.lineno}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            if node.func.attr in SENDS and not (
                isinstance(receiver, ast.Name) and receiver.id in ours
            ):
                found.append(f".{node.func.attr}() at line {node.lineno}")
            if node.func.attr in BUILDERS and (
                isinstance(receiver, ast.Name) and receiver.id in {"sa", "sqlalchemy"}
            ):
                found.append(f"sa.{node.func.attr}() at line {node.lineno}")
    return found


EXECUTOR = STORE / "executor.py"
DRIVER_SENDS = SENDS | {"scalar_one", "scalar_one_or_none", "copy", "stream"}


def sends_of(path: Path) -> list[str]:
    """What in a store module sends a statement other than through the executor protocol:
    a call of a connection's or cursor's ``execute``, ``scalar``, ``cursor`` and the like,
    on whatever receiver (the executor's own helpers have other names)."""
    tree = ast.parse(path.read_text(), str(path))
    return [
        f".{node.func.attr}() at line {node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in DRIVER_SENDS
    ]


def test_every_store_module_sends_through_the_executor() -> None:
    modules = sorted(p for p in STORE.glob("*.py") if p != EXECUTOR)
    assert len(modules) > 15
    found = {str(p.relative_to(ROOT)): sends_of(p) for p in modules}
    assert {path: problems for path, problems in found.items() if problems} == {}
    assert sends_of(EXECUTOR), "the executor sends the statements"


def test_the_store_scan_finds_a_statement_sent_around_the_executor(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from cyclone._store import executor as _executor\n"
        "def read(conn, stmt, driver):\n"
        "    _executor.first(conn, stmt)\n"
        "    _executor.execute(conn, stmt)\n"
        "    state = conn.execute(stmt).scalar()\n"
        "    driver.cursor().execute('select 1')\n"
        "    conn.exec_driver_sql('select 1')\n"
        "    return conn.scalars(stmt), conn.scalar_one(stmt)\n"
    )
    assert sorted(sends_of(probe)) == sorted(
        [
            ".execute() at line 4",
            ".execute() at line 5",
            ".scalar() at line 5",
            ".execute() at line 6",
            ".cursor() at line 6",
            ".exec_driver_sql() at line 7",
            ".scalars() at line 8",
            ".scalar_one() at line 8",
        ]
    )


def test_no_module_outside_the_store_builds_or_sends_a_statement() -> None:
    modules = outside_the_store()
    assert len(modules) > 30
    found = {str(p.relative_to(ROOT)): statements_of(p) for p in modules}
    assert {path: problems for path, problems in found.items() if problems} == {}


def test_the_store_holds_the_statements() -> None:
    assert sum(bool(statements_of(p)) for p in STORE.glob("*.py")) >= 10


def test_the_scan_finds_a_statement_built_or_sent(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sqlalchemy as sa\n"
        "from sqlalchemy import select\n"
        "from cyclone.schema import runs\n"
        "from cyclone._store import waits as _waits\n"
        "def read(engine, conn):\n"
        "    _waits.execute()\n"
        "    with engine.raw_connection() as raw:\n"
        "        raw.cursor().execute('select 1')\n"
        "    conn.exec_driver_sql('select 1')\n"
        "    return conn.scalar(sa.update(runs))\n"
    )
    assert sorted(statements_of(probe)) == sorted(
        [
            "imports sqlalchemy.select at line 2",
            "imports cyclone.schema.runs at line 3",
            ".execute() at line 8",
            ".cursor() at line 8",
            ".exec_driver_sql() at line 9",
            ".scalar() at line 10",
            "sa.update() at line 10",
        ]
    )


@pytest.mark.parametrize(
    "source",
    [
        "from sqlalchemy import select\n",
        "from sqlalchemy import insert\n",
        "import sqlalchemy as sa\n\nsa.update\n",
        "from sqlalchemy import delete\n",
        "from sqlalchemy import text\n",
        "from sqlalchemy.dialects.postgresql import insert\n",
        "from cyclone.schema import jobs\n",
    ],
)
@pytest.mark.parametrize("path", ["cyclone/probe.py", "cyclone/_probe.py"])
def test_ruff_refuses_a_statement_builder_outside_the_store(path: str, source: str) -> None:
    def ruff(path: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", path, "-"],
            input=f"from __future__ import annotations\n\n{source}",
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )

    refused = ruff(path)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "TID251" in refused.stdout
    allowed = ruff("cyclone/_store/probe.py")
    assert ("TID251" in allowed.stdout) == ("text" in source), allowed.stdout
