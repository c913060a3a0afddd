"""The README's performance commands run as written, in a smoke form.

Each ``python -m bench...`` command of the section's bash block runs with a small N and
a few figures against the test server, writing its results to a temporary folder. This
proves the documented commands work; it measures nothing (figures are taken by hand).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from tests.support import processes
from tests.support.docs import ROOT, blocks

SMOKE = {
    "bench.run": ["--quick", "--only", "a", "--rounds", "1", "--no-chart", "--no-statements"],
    "bench.peers": ["--quick", "--only", "raw,cyclone", "--figures", "1234", "--no-chart"],
}
"""What each documented command gets added: a small N, a few figures, no chart."""


def documented() -> dict[str, list[str]]:
    """``{module: arguments}`` of the ``python -m bench...`` commands of the section."""
    found: dict[str, list[str]] = {}
    for block in blocks("README.md", "## Performance", "bash"):
        for line in block.splitlines():
            for part in line.split("#")[0].split("&&"):
                words = shlex.split(part)
                if len(words) >= 3 and words[1] == "-m" and words[2].startswith("bench."):
                    found[words[2]] = words[3:]
    return found


def test_the_section_shows_the_benchmark_and_the_peers_commands() -> None:
    assert set(documented()) == set(SMOKE)


@pytest.mark.parametrize("module", sorted(SMOKE))
def test_a_documented_bench_command_runs_and_prints_its_table(
    module: str, database_url: URL, tmp_path: Path
) -> None:
    server = database_url.set(database="postgres").render_as_string(hide_password=False)
    env = {**os.environ, "CYCLONE_DATABASE_URL": server, "CYCLONE_BENCH_RESULTS": str(tmp_path)}
    args = [sys.executable, "-m", module, *documented()[module], *SMOKE[module]]
    done = processes.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "cyclone" in done.stdout
    assert list(tmp_path.glob("*.json")), "no results written"
