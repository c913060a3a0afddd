"""Read the fenced code blocks of a Markdown page, so tests run the snippets the docs show."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
