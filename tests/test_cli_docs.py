"""The terminal sessions of docs/cli.md and README.md (its "## From a shell"), run as written.

The ```console blocks of a file are one bash session in a fresh database: a ``$ `` line is a command
(``export CYCLONE_DATABASE_URL=...`` is pointed at the test's database), the lines after it
its expected output (stdout and stderr together). A line ``...`` stands for any lines.
What differs from run to run is normalised on both sides: run ids, timestamps, durations,
revision names, the version, line numbers in tracebacks, the database's name, host and port,
worker ids (``HOST:PID:ID``) and the host and pid of a worker.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from tests.support import processes

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "docs" / "cli.md", ROOT / "README.md"]
SEPARATOR = "@@cyclone-doc-command@@"

_NORMAL = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (
        re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:\d\d)?"),
        "<time>",
    ),
    (re.compile(r"\b\d+(?:\.\d+)?(?:ms|s)\b|\b\d+m\d\ds\b|\b\d+h\d\dm\b"), "<duration>"),
    (re.compile(r"cyclone_\d{4}"), "<revision>"),
    (re.compile(r"cyclone \d+\.\d+\.\d+\S*"), "cyclone <version>"),
    (re.compile(r", line \d+"), ", line <n>"),
    (re.compile(r"[\w.-]+:\d+:[0-9a-f]{8}\b"), "<worker>"),
    (re.compile(r'"host":"[^"]*","pid":\d+'), '"host":"<host>","pid":<pid>'),
    (re.compile(r'"version":"[^"]*"'), '"version":"<version>"'),
    (re.compile(r"(?<=\s)\d+\.\d+\.\d+\S*(?=\s+<time>|\s+-$)"), "<version>"),
    (re.compile(r"[ \t]+"), " "),
]


def session(path: Path) -> str:
    """Every ```console block of a file, in order: one session, prose in between."""
    return "".join(re.findall(r"^```console\n(.*?)^```", path.read_text(), flags=re.S | re.M))


def parse(session: str) -> list[tuple[str, list[str]]]:
    """``(command, expected output lines)`` pairs of one session."""
    steps: list[tuple[str, list[str]]] = []
    for line in session.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"output before the first command: {line!r}"
            steps[-1][1].append(line)
    return steps


def normalise(text: str) -> str:
    lines = []
    for line in text.splitlines():
        for pattern, replacement in _NORMAL:
            line = pattern.sub(replacement, line)
        lines.append(line.strip())
    return "\n".join(lines).strip("\n")


def matches(expected: list[str], actual: str) -> bool:
    pattern = "".join(
        r"(?:[^\n]*\n)*?" if line.strip() == "..." else re.escape(normalise(line)) + r"\n"
        for line in expected
    )
    return re.fullmatch(pattern, normalise(actual) + "\n" if actual.strip() else "") is not None


def run_session(session: str, url: URL) -> list[tuple[str, list[str], str]]:
    """Run every command of a session in one bash; return (command, expected, actual)."""
    steps = parse(session)
    plain = url.render_as_string(hide_password=False).replace(
        "postgresql+psycopg://", "postgresql://"
    )
    script = []
    for command, _ in steps:
        if command.startswith("export CYCLONE_DATABASE_URL="):
            command = f"export CYCLONE_DATABASE_URL={plain}"
        script.append(f"echo {SEPARATOR}\n{{ {command}\n}} 2>&1")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "200",
    }
    env.pop("CYCLONE_DATABASE_URL", None)
    done = processes.run(
        ["bash", "-c", "\n".join(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    outputs = done.stdout.split(SEPARATOR + "\n")[1:]
    assert len(outputs) == len(steps), done.stdout + done.stderr
    where = f"{url.host}:{url.port or 5432}"
    return [
        (
            command,
            expected,
            actual.replace(str(url.database), "shop").replace(where, "127.0.0.1:5432"),
        )
        for (command, expected), actual in zip(steps, outputs, strict=True)
    ]


def test_the_docs_have_terminal_sessions() -> None:
    for path in DOCS:
        assert "$ cyclone " in session(path), path


@pytest.mark.processes
@pytest.mark.timeout(300)  # as long as its session's bash may take (a loaded machine)
@pytest.mark.parametrize("path", DOCS, ids=[path.name for path in DOCS])
def test_a_terminal_session_prints_what_the_docs_show(fresh_database: URL, path: Path) -> None:
    results = run_session(session(path), fresh_database)
    wrong = [
        f"$ {command}\n--- the docs show:\n{chr(10).join(expected)}\n--- it printed:\n{actual}"
        for command, expected, actual in results
        if not matches(expected, actual)
    ]
    assert not wrong, "\n\n".join(wrong)
