"""The README's first sections, run as written: the quickstart's demo, pointing cyclone at
a database, defining and submitting, and running a worker (the other sections have tests of
their own, named in ``tests.support.docs.EXECUTED``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

import cyclone
from cyclone import migrations
from tests.conftest import drop_database, own_database, wait_until
from tests.support import at_rest, docs, processes

README = "README.md"
QUICKSTART = "## Quickstart (a fresh machine)"
POINTING = "## Pointing cyclone at a database"
DEFINING = "## Defining and submitting"
RUNNING = "## Running"
DOCUMENTED_URL = '"postgresql+psycopg://app@db.internal/app"'


def _url(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def test_the_quickstart_names_the_demo_and_the_test_command() -> None:
    (block,) = docs.blocks(README, QUICKSTART, "bash")
    commands = [line.split("#")[0].strip() for line in block.splitlines()]
    assert [command for command in commands if command] == ["scripts/demo", "scripts/test"]
    assert (docs.ROOT / ".ci/run").read_text().rstrip().endswith("exec bash scripts/test")


@pytest.mark.processes
def test_the_quickstart_demo_runs_the_checkout_example_to_its_result(database_url: URL) -> None:
    """``scripts/demo`` as written (the venv already made), against the test server, in a
    database of its own named by ``CYCLONE_DEMO_DATABASE`` (a developer's ``cyclone_demo``
    there is left alone): the script creates it, as it creates ``cyclone_demo``, and the
    test drops it afterwards."""
    demo = make_url(os.environ["CYCLONE_TEST_DATABASE_URL"]).set(
        database=f"{database_url.database}_demo"
    )
    drop_database(demo)
    at_rest.drop_after_test(lambda: drop_database(demo))
    env = {
        **os.environ,
        "CYCLONE_SKIP_INSTALL": "1",
        "CYCLONE_DATABASE_URL": os.environ["CYCLONE_TEST_DATABASE_URL"],
        "CYCLONE_DEMO_DATABASE": demo.database,
    }
    done = processes.run(
        ["bash", "scripts/demo"],
        cwd=docs.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "status: completed" in done.stdout
    with sa.create_engine(demo, poolclass=sa.NullPool).connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM cyclone_runs")).scalar_one() > 0


def test_pointing_cyclone_at_a_database_upgrades_it_and_again() -> None:
    """The block with the documented URL replaced by a new empty database's: the schema
    appears, and running the block a second time changes nothing."""
    (block,) = docs.blocks(README, POINTING)
    assert DOCUMENTED_URL in block
    url = own_database("cyclone_readme")
    code = block.replace(DOCUMENTED_URL, repr(_url(url)))
    for _ in range(2):
        namespace: dict[str, object] = {}
        exec(compile(code, f"{README}: {POINTING}", "exec"), namespace)
        engine = namespace["engine"]
        assert isinstance(engine, sa.Engine)
        try:
            with engine.connect() as conn:
                tables = set(sa.inspect(conn).get_table_names())
                revision = conn.execute(
                    sa.text("SELECT version_num FROM cyclone_alembic_version")
                ).scalar_one()
        finally:
            cyclone.close(engine)
            engine.dispose()
        assert {"cyclone_runs", "cyclone_jobs", "cyclone_alembic_version"} <= tables
        assert revision == migrations.head_revision()


class Reservation(msgspec.Struct):
    sku: str


class Receipt(msgspec.Struct):
    cents: int


def test_defining_and_submitting_makes_one_run_per_key(engine: sa.Engine, name: str) -> None:
    """The block runs with the types it leaves undefined in scope; its submit makes the
    key's run, and submitting the same order again returns that run."""
    (block,) = docs.blocks(README, DEFINING)
    code = block.replace('"checkout"', repr(f"{name}-checkout"))
    namespace: dict[str, object] = {
        "cyclone": cyclone,
        "engine": engine,
        "Reservation": Reservation,
        "Receipt": Receipt,
    }
    prelude = "order = Order(order_id='42', cents=1350)\n"
    definitions, submit = code.split("\n\nrun, created =")
    exec(compile(definitions, f"{README}: {DEFINING}", "exec"), namespace)
    exec(prelude + "run, created =" + submit, namespace)
    run, created = namespace["run"], namespace["created"]
    assert created is True
    assert isinstance(run, cyclone.Run)
    exec(prelude + "run, created =" + submit, namespace)
    assert namespace["created"] is False
    assert namespace["run"].id == run.id  # type: ignore[attr-defined]
    checkout = namespace["checkout"]
    assert isinstance(checkout, cyclone.Workflow)
    assert list(checkout.steps) == ["reserve", "charge"]


_RUNNING_PRELUDE = """\
import os, sys

import sqlalchemy as sa

import cyclone

engine = sa.create_engine(os.environ["CYCLONE_DATABASE_URL"])
checkout = cyclone.Workflow(os.environ["README_WORKFLOW"], input=dict)


@checkout.step()
def reserve(ctx, order):
    return {"reserved": order["order_id"]}


@cyclone.step(os.environ["README_KIND"])
def send_email(ctx, args):
    return None


checkout.submit_once(engine, "order:drained", {"order_id": "drained"})
"""

_RUNNING_AFTER = """\
print("returned", flush=True)
"""


def _waiting_workers(engine: sa.Engine) -> set[str]:
    """The workers recorded as idle and waiting for work (only ``run()`` records itself)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT worker_id FROM cyclone_waiters"))
        return {row[0] for row in rows}


@pytest.mark.processes
def test_the_running_block_drains_then_serves_until_sigterm(
    database_url: URL, engine: sa.Engine, name: str, tmp_path: Path
) -> None:
    """The block's ``drain()`` runs the run submitted before it; the worker then serves a
    run submitted later (by ``drain()`` still confirming it is idle, or by ``run()``), and
    ``run(grace=30)`` returns on SIGTERM (exit status 0)."""
    (block,) = docs.blocks(README, RUNNING)
    script = tmp_path / "running.py"
    script.write_text(_RUNNING_PRELUDE + block + _RUNNING_AFTER)
    env = {
        **os.environ,
        "CYCLONE_DATABASE_URL": _url(database_url),
        "README_WORKFLOW": f"{name}-checkout",
        "README_KIND": f"{name}.email",
    }
    checkout = cyclone.Workflow(f"{name}-checkout", input=dict)

    @checkout.step()
    def reserve(ctx: cyclone.StepContext, order: dict[str, str]) -> None: ...

    client = cyclone.Client(engine)
    before = _waiting_workers(engine)
    with processes.popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    ) as proc:
        drained = wait_until(lambda: checkout.get_run(engine, "order:drained"), timeout=60)
        wait_until(lambda: drained.status().state is cyclone.RunState.COMPLETED, timeout=60)
        served, _ = checkout.submit_once(engine, "order:served", {"order_id": "served"})
        wait_until(lambda: served.status().state is cyclone.RunState.COMPLETED, timeout=60)
        detail = client.get_run_detail(served.id)
        assert detail is not None
        assert [step.output for step in detail.steps] == [{"reserved": "served"}]
        # drain() may have run "served" too: signal once run() is underway (its handlers
        # set), which its worker shows by recording itself as waiting for work, idle.
        wait_until(lambda: _waiting_workers(engine) - before, timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.splitlines()[-1] == "returned"


def test_every_readme_section_with_code_is_registered() -> None:
    sections = {fence.headings[1] for fence in docs.fences(README) if len(fence.headings) > 1}
    registered = {e.heading for e in docs.EXECUTED if e.page == README}
    assert sections <= registered, textwrap.fill(str(sections - registered))
