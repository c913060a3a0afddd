"""Code snippets of the Markdown docs, so that tests run exactly what the docs show.

A named snippet is a fenced block preceded by ``<!-- snippet: NAME -->`` on the line above;
:func:`blocks` and :func:`all_blocks` read the fenced blocks of a section or of a page.
:data:`EXECUTED` names the test that runs each section's blocks, for every page of docs/
(``tests/test_docs_pages.py`` checks that no block of a page is left out).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
_SNIPPET = re.compile(r"<!-- snippet: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.S)
_FENCE = re.compile(r"^```\w*$", re.M)


def snippets(relative: str) -> dict[str, tuple[str, str]]:
    """``{name: (language, code)}`` of the named snippets of a Markdown file."""
    text = (ROOT / relative).read_text()
    return {m.group(1): (m.group(2), m.group(3)) for m in _SNIPPET.finditer(text)}


def fenced_blocks(relative: str, *, start: str | None = None, end: str | None = None) -> int:
    """How many fenced blocks the file has (between the headings ``start`` and ``end``)."""
    text = (ROOT / relative).read_text()
    if start is not None:
        text = text[text.index(start) :]
    if end is not None and end in text:
        text = text[: text.index(end)]
    return len(_FENCE.findall(text)) // 2


def snippet(relative: str, name: str) -> str:
    return snippets(relative)[name][1]


def section(page: str, heading: str) -> list[str]:
    """The lines of ``page`` (relative to the repository) under ``heading``, up to the next
    heading of the same or a higher level (lines inside fences are never headings)."""
    lines = (ROOT / page).read_text().splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = lines.index(heading) + 1
    fenced = False
    for end in range(start, len(lines)):
        line = lines[end]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            hashes = len(line) - len(line.lstrip("#"))
            if hashes <= level and line[hashes : hashes + 1] == " ":
                return lines[start:end]
    return lines[start:]


def blocks(page: str, heading: str, language: str = "python") -> list[str]:
    """The fenced blocks of ``language`` under ``heading`` of ``page``, in order."""
    return _fenced(section(page, heading), language)


def _fenced(lines: list[str], language: str) -> list[str]:
    found: list[str] = []
    current: list[str] | None = None
    keep = False
    for line in lines:
        if line.startswith("```") and current is None:
            current, keep = [], line[3:].strip() == language
        elif line.startswith("```"):
            if keep:
                found.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    return found


def all_blocks(page: str, language: str = "python") -> list[str]:
    """The fenced blocks of ``language`` anywhere in ``page``, in order."""
    lines = (ROOT / page).read_text().splitlines()
    return _fenced(lines, language)


@dataclass(frozen=True)
class Fence:
    """A fenced block of a page: its language, first line, and the headings it is under."""

    language: str
    line: int
    headings: tuple[str, ...]


def fences(page: str) -> list[Fence]:
    """Every fenced block of ``page``, with the chain of headings above it."""
    found: list[Fence] = []
    chain: list[str] = []
    fenced = False
    for number, line in enumerate((ROOT / page).read_text().splitlines(), start=1):
        if line.startswith("```"):
            if not fenced:
                found.append(Fence(line[3:].strip(), number, tuple(chain)))
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            level = len(line) - len(line.lstrip("#"))
            chain = [h for h in chain if len(h) - len(h.lstrip("#")) < level] + [line]
    return found


@dataclass(frozen=True)
class Executed:
    """``test`` (``tests/FILE.py::NAME``) runs the blocks of ``page`` under ``heading``
    (all of the page's when None) written in ``language`` (any when None)."""

    page: str
    heading: str | None
    test: str
    language: str | None = None

    def covers(self, page: str, fence: Fence) -> bool:
        return (
            page == self.page
            and (self.heading is None or self.heading in fence.headings)
            and (self.language is None or self.language == fence.language)
        )


EXECUTED = (
    Executed(
        "docs/flow-control.md",
        "## Examples",
        "tests/test_flow_control_docs.py::test_every_block_of_the_flow_control_page_runs",
    ),
    Executed(
        "README.md",
        "## Quickstart (a fresh machine)",
        "tests/test_readme.py::test_the_quickstart_demo_runs_the_checkout_example_to_its_result",
    ),
    Executed(
        "README.md",
        "## Pointing cyclone at a database",
        "tests/test_readme.py::test_pointing_cyclone_at_a_database_upgrades_it_and_again",
    ),
    Executed(
        "README.md",
        "## Defining and submitting",
        "tests/test_readme.py::test_defining_and_submitting_makes_one_run_per_key",
    ),
    Executed(
        "README.md",
        "## In your transaction (Flask, Django, a shared Session, plain psycopg)",
        "tests/test_readme_transaction.py::test_every_block_of_the_section_runs_and_commits_with_the_callers_rows",
    ),
    Executed(
        "README.md",
        "## Keys and time",
        "tests/test_docs_keys_and_time.py::test_readme_keys_and_time_blocks_run",
    ),
    Executed(
        "README.md",
        "## Running",
        "tests/test_readme.py::test_the_running_block_drains_then_serves_until_sigterm",
    ),
    Executed(
        "README.md",
        "## From a shell",
        "tests/test_cli_docs.py::test_a_terminal_session_prints_what_the_docs_show",
    ),
    Executed(
        "README.md",
        "## Dashboard",
        "tests/test_dashboard_docs.py::test_cli_snippet_serves_the_dashboard",
    ),
    Executed(
        "README.md",
        "## Performance",
        "tests/test_bench_docs.py::test_a_documented_bench_command_runs_and_prints_its_table",
    ),
    Executed(
        "docs/cli.md",
        None,
        "tests/test_cli_docs.py::test_a_terminal_session_prints_what_the_docs_show",
    ),
    Executed(
        "docs/dashboard.md",
        None,
        "tests/test_dashboard_docs.py::test_every_block_of_the_page_is_a_named_snippet_a_test_runs",
    ),
    Executed(
        "docs/deployment.md",
        "## Database roles and grants",
        "tests/test_roles.py::test_an_application_role_with_the_documented_grants_runs_everything",
    ),
    Executed(
        "docs/deployment.md",
        "## Behind PgBouncer",
        "tests/test_pgbouncer.py::test_the_deployment_guide_snippet_runs_behind_pgbouncer",
    ),
    Executed(
        "docs/django.md",
        None,
        "tests/test_django.py::test_every_python_snippet_of_docs_django_md_is_taken_from_the_test_project",
        "python",
    ),
    Executed(
        "docs/django.md",
        None,
        "tests/test_django.py::test_every_command_of_docs_django_md_is_run_by_a_test",
        "bash",
    ),
    Executed(
        "docs/flask.md",
        None,
        "tests/test_flask.py::test_every_python_snippet_of_the_flask_doc_is_code_of_the_example",
        "python",
    ),
    Executed(
        "docs/flask.md",
        None,
        "tests/test_flask.py::test_the_flask_doc_commands_run_as_written",
        "console",
    ),
    Executed(
        "docs/children.md",
        None,
        "tests/test_children.py::test_the_children_page_blocks_run_in_order",
    ),
    Executed(
        "docs/fork.md",
        None,
        "tests/test_fork.py::test_the_fork_page_blocks_run_in_order",
    ),
    Executed(
        "docs/jobs.md",
        "## Standalone jobs and unique keys",
        "tests/test_docs_pages.py::test_the_standalone_jobs_blocks_enqueue_jobs_a_worker_runs",
    ),
    Executed(
        "docs/keys.md", None, "tests/test_docs_keys_and_time.py::test_doc_page_blocks_run_in_order"
    ),
    Executed(
        "docs/map.md",
        None,
        "tests/test_map.py::test_the_map_page_blocks_run_in_order",
    ),
    Executed(
        "docs/migrations.md",
        None,
        "tests/test_alembic_wheel.py::test_every_block_of_the_doc_is_a_snippet_these_tests_run",
    ),
    *(
        Executed(
            "docs/operations.md",
            heading,
            "tests/test_docs_pages.py::test_the_operations_blocks_list_purge_and_recover_runs",
        )
        for heading in (
            "## Listing, pagination and counts",
            "## Retention and the sweeper",
            "## Recovery workflows",
        )
    ),
    *(
        Executed(
            "docs/operations.md",
            heading,
            "tests/test_docs_pages.py::test_the_operations_blocks_act_in_bulk_and_pause_a_queue",
        )
        for heading in ("## Retrying and cancelling in bulk", "## Pausing a queue")
    ),
    Executed(
        "docs/operations.md",
        "## Which workers are alive",
        "tests/test_worker_registry.py::test_the_operations_block_prints_the_running_workers",
    ),
    Executed(
        "docs/operations.md",
        "## Tracing and metrics",
        "tests/test_otel.py::test_operations_doc_tracing_snippet_runs",
    ),
    Executed(
        "docs/schedules.md",
        None,
        "tests/test_docs_keys_and_time.py::test_doc_page_blocks_run_in_order",
    ),
    Executed(
        "docs/signals.md",
        None,
        "tests/test_docs_keys_and_time.py::test_doc_page_blocks_run_in_order",
    ),
)
