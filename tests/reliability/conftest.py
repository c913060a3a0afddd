"""Fixtures of the reliability suite: a private cluster, a database per scenario, figures.

The cluster is started once for the session (never the shared server: scenarios restart
it, stop it hard and terminate its backends) and removed at the end. Each scenario
records its figures with :func:`figures`; they are printed in the terminal summary (by
tests/conftest.py, from the test reports, so that pytest-xdist's workers' figures show
too) and written to ``tests/reliability/.figures/last-run.json``.

Under pytest-xdist one process runs the whole suite, one scenario after the other on
one cluster (tests/conftest.py's ``TOGETHER``): the load each puts on the machine is part
of what it measures.
"""

from __future__ import annotations

import fcntl
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from tests.support import at_rest
from tests.support.pgcluster import Cluster, server_bindir
from tests.support.reliability_proc import EXECUTIONS_DDL

FIGURES_DIR = Path(__file__).parent / ".figures"
_current: list[pytest.Item] = []


@pytest.fixture(autouse=True)
def _figures_go_to_this_test(request: pytest.FixtureRequest) -> None:
    """:func:`figures` records on the test running (or the last one, for a module fixture)."""
    _current[:] = [request.node]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    bindir = server_bindir()
    if bindir is None:
        pytest.fail("the reliability suite needs PostgreSQL server binaries (initdb, pg_ctl)")
    cluster = Cluster(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def scenario_url(cluster: Cluster) -> URL:
    """A fresh database on the private cluster, migrated, with the ``executions`` table."""
    url = cluster.create_database(f"rel_{uuid.uuid4().hex[:10]}")
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text(EXECUTIONS_DDL))
    engine.dispose()
    at_rest.touch(url)
    return url


def figures(scenario: str, **values: Any) -> None:
    """Record a scenario's figures: on the test's report for the summary, and in the JSON
    file (read, updated and written under a lock: test processes may run at once)."""
    line = summary_line(scenario, values)
    if _current:
        _current[0].user_properties.append(("figures", line))
    FIGURES_DIR.mkdir(exist_ok=True)
    path = FIGURES_DIR / "last-run.json"
    with (FIGURES_DIR / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous: dict[str, Any] = {}
        if path.exists():
            try:
                previous = json.loads(path.read_text())
            except ValueError:
                previous = {}
        previous[scenario] = {
            **values,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        path.write_text(json.dumps(previous, indent=2, sort_keys=True) + "\n")
    print(line)


def summary_line(scenario: str, values: dict[str, Any]) -> str:
    return f"reliability {scenario}: " + ", ".join(f"{k}={v}" for k, v in values.items())
