"""Every program in examples/ runs to completion against the test database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from tests.support import processes

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def test_there_are_examples() -> None:
    assert "recovery.py" in {path.name for path in EXAMPLES}


@pytest.mark.processes
@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
def test_example_runs_and_exits_zero(database_url: URL, example: Path) -> None:
    env = {**os.environ, "CYCLONE_DATABASE_URL": os.environ["CYCLONE_TEST_DATABASE_URL"]}
    done = processes.run(
        [sys.executable, str(example)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
