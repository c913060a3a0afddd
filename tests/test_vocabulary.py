"""One vocabulary (docs/glossary.md): what users read says the public API's words, never
the names of the columns behind them or a retired name."""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import cyclone
from cyclone.cli import _app
from cyclone.client import JobDetail, StepStatus
from cyclone.states import JobState, RunState

ROOT = Path(__file__).resolve().parent.parent
RETIRED = re.compile(r"finalized_at|attempted_at|finalized|attempted at|sweep_keep|prun", re.I)
"""Column names and former API words that users must not meet outside the glossary."""

KEEP_COLUMN_NAMES = {"schema.py", "worker.py"}
"""The tables themselves, and the Worker, which still takes ``sweep_keep=`` (deprecated)."""

USER_FACING = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "cyclone" / "dashboard" / "templates").glob("*.html"),
        *(ROOT / "cyclone" / "cli").glob("*.py"),
        *(ROOT / "cyclone" / "dashboard").glob("*.py"),
        *(
            module
            for module in (ROOT / "cyclone").glob("*.py")
            if not module.name.startswith("_") and module.name not in KEEP_COLUMN_NAMES
        ),
    ]
)
GLOSSARY = ROOT / "docs" / "glossary.md"
"""The one page that names the columns, to say which public word each one backs."""

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def a_run() -> cyclone.RunStatus:
    return cyclone.RunStatus(
        id=uuid.uuid4(),
        workflow="checkout",
        key="order-1",
        state=RunState.FAILED,
        created_at=NOW,
        finished_at=NOW,
        deadline=None,
        error={"type": "ValueError", "message": "no"},
        failed_step="charge",
        retention=timedelta(days=1),
    )


def a_job() -> cyclone.JobStatus:
    return cyclone.JobStatus(
        id=1,
        kind="email.send",
        key=None,
        queue="mail",
        priority=0,
        state=JobState.FAILED,
        attempt=1,
        max_attempts=1,
        created_at=NOW,
        scheduled_at=NOW,
        finished_at=NOW,
        errors=[{"type": "ValueError", "message": "no"}],
    )


def a_step() -> StepStatus:
    return StepStatus(
        name="charge",
        job_id=2,
        state=JobState.COMPLETED,
        queue="default",
        attempt=1,
        max_attempts=3,
        scheduled_at=NOW,
        started_at=NOW,
        finished_at=NOW,
        errors=[],
        output=None,
        worker_id="host:1:abc",
    )


@pytest.mark.parametrize("path", USER_FACING, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_template_or_command_shows_a_column_name_or_a_retired_word(path: Path) -> None:
    found = [
        f"{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if RETIRED.search(line)
    ]
    assert path == GLOSSARY or found == [], "say the glossary's word (docs/glossary.md)"


def test_the_glossary_names_each_column_with_the_word_users_read_for_it() -> None:
    text = GLOSSARY.read_text()
    for word, column in [
        ("`RunStatus.finished_at`", "`cyclone_runs.finalized_at`"),
        ("`StepStatus.started_at`", "`cyclone_jobs.attempted_at`"),
    ]:
        assert re.search(rf"^\| {re.escape(word)}.* \| {re.escape(column)} \|$", text, re.M)


def test_runs_list_json_keys_are_the_fields_of_run_status() -> None:
    assert set(_app._run_record(a_run())) == names(cyclone.RunStatus)


def test_runs_show_json_keys_are_run_status_and_each_steps_step_status() -> None:
    detail = _app.RunDetail(
        status=a_run(),
        input=1,
        result_step=None,
        result=None,
        steps=[a_step()],
        graph={"steps": []},
        steps_remaining=0,
        read_at=NOW,
    )
    record = _app._run_detail_record(detail)
    expected = {"input", "result_step", "result", "steps", "children", "children_total"}
    assert set(record) == names(cyclone.RunStatus) | expected
    assert set(record["steps"][0]) == names(StepStatus) | {"duration"}


def test_jobs_list_json_keys_are_the_fields_of_job_status_and_its_last_error() -> None:
    assert set(_app._job_record(a_job())) == names(cyclone.JobStatus) | {"error"}


def test_jobs_show_json_keys_are_job_status_and_job_detail_fields() -> None:
    detail = JobDetail(status=a_job(), args=1, output=None, started_at=NOW, worker_id=None)
    record = _app._job_detail_record(detail)
    assert set(record) == names(cyclone.JobStatus) | {"error"} | names(JobDetail) - {"status"}
