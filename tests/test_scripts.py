"""scripts/demo, scripts/test and .ci/run: what each sets up (run on a copy with stubs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["scripts/env.sh", "scripts/test", "scripts/demo", ".ci/run"]

# Stands for .venv/bin/python and .venv/bin/ruff: records its arguments; as scripts/demo's
# `python -` (which makes the demo's database) it prints a URL instead.
VENV_STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "$CALLS"
if [ "$1" = - ]; then cat >/dev/null; echo postgresql+psycopg://postgres@127.0.0.1/cyclone_demo; fi
"""
RECORDER = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'


def stub(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the scripts whose venv, debian-packages.sh and apt-get only record calls."""
    root = tmp_path / "repo"
    for script in SCRIPTS:
        (root / script).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / script, root / script)
    stub(root / "scripts" / "debian-packages.sh", RECORDER)
    for tool in ("python", "ruff"):
        stub(root / ".venv" / "bin" / tool, VENV_STUB)
    stub(tmp_path / "bin" / "apt-get", RECORDER)
    return root


def run(checkout: Path, *command: str) -> list[str]:
    calls = checkout.parent / "calls"
    calls.touch()
    env = {
        **os.environ,
        "PATH": f"{checkout.parent / 'bin'}:{os.environ['PATH']}",
        "CALLS": str(calls),
        "CYCLONE_SKIP_INSTALL": "1",
        "CYCLONE_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1/postgres",
    }
    done = subprocess.run(
        ["bash", *command], cwd=checkout, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines()


def test_the_scripts_parse() -> None:
    for script in [*SCRIPTS, "scripts/debian-packages.sh"]:
        subprocess.run(["bash", "-n", ROOT / script], check=True)


def test_the_demo_installs_no_debian_package(checkout: Path) -> None:
    calls = run(checkout, "scripts/demo")
    assert calls[-1] == "python examples/checkout.py"
    assert not [call for call in calls if call.startswith(("debian-packages.sh", "apt-get"))]


@pytest.mark.parametrize("entry", ["scripts/test", ".ci/run"])
def test_the_tests_install_chromium_and_pgbouncer_before_running(
    checkout: Path, entry: str
) -> None:
    calls = run(checkout, entry)
    wanted = "debian-packages.sh chromium=/usr/bin/chromium pgbouncer=/usr/sbin/pgbouncer"
    assert calls.count(wanted) == 1
    assert calls.index(wanted) < calls.index("ruff check .")  # before the first step
    assert calls[-1].startswith("python -m pytest")


@pytest.mark.skipif(os.geteuid() != 0, reason="apt-get is run only as root")
def test_debian_packages_installs_what_is_missing_with_apt_get(tmp_path: Path) -> None:
    stub(tmp_path / "bin" / "apt-get", RECORDER)
    calls = tmp_path / "calls"
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CALLS": str(calls)}
    subprocess.run(
        ["bash", ROOT / "scripts/debian-packages.sh", "sh=/bin/sh", "nothere=/nonexistent/x"],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert calls.read_text().splitlines() == [
        "apt-get update -qq",
        "apt-get install -y -qq nothere",
    ]
