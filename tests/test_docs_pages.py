"""The pages of docs/ as a whole: every fenced block is run by a test named in
``tests.support.docs.EXECUTED``, every link between pages reaches a heading, the schema
revision the docs name is the newest; and the blocks of docs/jobs.md and
docs/operations.md that no other test runs, run here as written."""

from __future__ import annotations

import ast
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone import migrations
from tests.support import docs

PAGES = sorted(f"docs/{path.name}" for path in (docs.ROOT / "docs").glob("*.md"))
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_fenced_block_of_every_docs_page_is_run_by_a_registered_test() -> None:
    untested = [
        f"{page}:{fence.line} ({fence.language or 'no language'}, under {fence.headings})"
        for page in ["README.md", *PAGES]
        for fence in docs.fences(page)
        if not any(executed.covers(page, fence) for executed in docs.EXECUTED)
    ]
    assert untested == [], "blocks no test in tests.support.docs.EXECUTED runs"


@pytest.mark.parametrize("executed", docs.EXECUTED, ids=lambda e: f"{e.page} {e.heading or ''}")
def test_a_registered_test_exists_reads_its_page_and_has_blocks_to_run(
    executed: docs.Executed,
) -> None:
    file, name = executed.test.split("::")
    source = (docs.ROOT / file).read_text()
    functions = {
        node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef)
    }
    assert name in functions, f"no test {name} in {file}"
    assert Path(executed.page).name in source, f"{file} never names {executed.page}"
    fences = [
        fence for fence in docs.fences(executed.page) if executed.covers(executed.page, fence)
    ]
    assert fences, f"nothing to run under {executed.heading} of {executed.page}"
    if executed.heading is not None:
        snippets = re.findall(
            r"<!-- snippet: ([\w-]+) -->", "\n".join(docs.section(executed.page, executed.heading))
        )
        named = [executed.heading, *(f'"{snippet}"' for snippet in snippets)]
        assert any(text in source for text in named), f"{file} reads none of {named}"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@pytest.mark.parametrize("page", ["README.md", *PAGES])
def test_every_link_of_a_page_reaches_a_file_and_heading(page: str) -> None:
    text = (docs.ROOT / page).read_text()
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (docs.ROOT / page).parent / file if file else docs.ROOT / page
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md":
            lines = [line for line in path.read_text().splitlines() if re.match(r"#+ ", line)]
            if anchor not in {slug(line) for line in lines}:
                broken.append(target)
    assert broken == []


@pytest.mark.parametrize("page", ["README.md", "docs/cli.md", "docs/deployment.md"])
def test_the_revision_the_docs_call_the_newest_is_the_head(page: str) -> None:
    text = (docs.ROOT / page).read_text()
    named = re.findall(
        r"(?:expected|found|nothing to|newest revision is)\s+`?(cyclone_\d{4}(?:_[a-z_]+)?)", text
    )
    assert named
    assert set(named) == {migrations.head_revision()}


def run(blocks: list[str], namespace: dict[str, Any], page: str) -> None:
    assert blocks, f"no python blocks to run in {page}"
    for i, block in enumerate(blocks):
        exec(compile(block, f"{page} block {i + 1}", "exec"), namespace)


def test_the_standalone_jobs_blocks_enqueue_jobs_a_worker_runs(own_engine: sa.Engine) -> None:
    page = "docs/jobs.md"
    sent: list[tuple[str, str]] = []

    def deliver(to: str, subject: str) -> str:
        sent.append((to, subject))
        return f"sent to {to}"

    def save_user(conn: sa.Connection, user: Any) -> None:
        conn.execute(sa.text("CREATE TABLE users (email text)"))
        conn.execute(sa.text("INSERT INTO users VALUES (:email)"), {"email": user.email})

    namespace: dict[str, Any] = {
        "__name__": "docs_jobs",
        "msgspec": __import__("msgspec"),
        "cyclone": cyclone,
        "engine": own_engine,
        "deliver": deliver,
        "save_user": save_user,
        "user": SimpleNamespace(email="grace@example.com"),
    }
    run(docs.blocks(page, "## Standalone jobs and unique keys"), namespace, page)
    send_email, job = namespace["send_email"], namespace["job"]
    with pytest.raises(cyclone.DuplicateError):
        send_email.enqueue(
            own_engine, namespace["Email"]("bob@example.com", "x"), unique="welcome:42"
        )
    with cyclone.Worker(own_engine, steps=[send_email]) as worker:
        assert worker.drain() == 2
    assert job.result(timeout=10) == "sent to ada@example.com"
    assert sorted(sent) == [("ada@example.com", "welcome"), ("grace@example.com", "hello")]


def test_the_operations_blocks_list_purge_and_recover_runs(own_engine: sa.Engine) -> None:
    """The blocks of the listing, retention and recovery sections, in order, on a
    database with checkout runs, a standalone job and a failed ``charge`` run."""
    page = "docs/operations.md"
    checkout = cyclone.Workflow("checkout", input=int)
    checkout.step()(lambda ctx, order: None)
    charge = cyclone.Workflow("charge", input=int)

    @charge.step(max_attempts=1)
    def capture(ctx: cyclone.StepContext, order: int) -> None:
        raise RuntimeError("card declined")

    undo_charge = cyclone.Workflow("undo_charge", input=str)
    undo_charge.step()(lambda ctx, failed_run_id: None)
    email = cyclone.step("email.send")(lambda ctx, args: None)

    runs = [checkout.submit(own_engine, order) for order in range(3)]
    job = email.enqueue(own_engine, {"to": "ada@example.com"})
    failed = charge.submit(own_engine, 1)
    with cyclone.Worker(own_engine, workflows=[charge]) as worker:
        worker.drain()
    pages: list[list[cyclone.RunStatus]] = []
    namespace: dict[str, Any] = {
        "__name__": "docs_operations",
        "cyclone": cyclone,
        "engine": own_engine,
        "timedelta": timedelta,
        "undo_charge": undo_charge,
        "run_id": runs[0].id,
        "job_id": job.id,
        "handle": pages.append,
    }
    for heading in (
        "## Listing, pagination and counts",
        "## Retention and the sweeper",
        "## Recovery workflows",
    ):
        run(docs.blocks(page, heading), namespace, page)

    assert [status.id for page_ in pages for status in page_] == [r.id for r in reversed(runs)]
    assert namespace["created"] is True
    recovery = namespace["recovery"]
    assert recovery.status().key == f"recover:{failed.id}"
    client = cyclone.Client(own_engine)
    status = client.get_run(failed.id)
    assert status is not None
    assert status.retention == timedelta(days=30)


def test_the_operations_blocks_act_in_bulk_and_pause_a_queue(own_engine: sa.Engine) -> None:
    """The blocks of the bulk and queue sections, in order, on a database with a failed
    ``charge`` run, two running ``checkout`` runs and a job waiting in queue ``emails``."""
    page = "docs/operations.md"
    charge = cyclone.Workflow("charge", input=int)

    @charge.step(max_attempts=1)
    def capture(ctx: cyclone.StepContext, order: int) -> None:
        raise RuntimeError("card declined")

    checkout = cyclone.Workflow("checkout", input=int)
    checkout.step()(lambda ctx, order: None)
    email = cyclone.step("email.send", queue="emails")(lambda ctx, args: None)
    failed = charge.submit(own_engine, 1)
    with cyclone.Worker(own_engine, workflows=[charge]) as worker:
        worker.drain()
    running = [checkout.submit(own_engine, order) for order in range(2)]
    job = email.enqueue(own_engine, {"to": "ada@example.com"})
    with own_engine.connect() as conn:
        an_hour_ago = conn.execute(sa.select(sa.func.now() - timedelta(hours=1))).scalar_one()
    namespace: dict[str, Any] = {
        "__name__": "docs_operations_bulk",
        "cyclone": cyclone,
        "engine": own_engine,
        "an_hour_ago": an_hour_ago,
    }
    run(docs.blocks(page, "## Retrying and cancelling in bulk"), namespace, page)
    assert (namespace["retried"], namespace["cancelled"]) == (1, 2)
    assert failed.status().state == cyclone.RunState.RUNNING
    assert {r.status().state for r in running} == {cyclone.RunState.CANCELLED}
    run(docs.blocks(page, "## Pausing a queue"), namespace, page)
    with cyclone.Worker(own_engine, workflows=[charge], steps=[email]) as worker:
        worker.drain()
    assert job.status().state == cyclone.JobState.COMPLETED
