"""Code snippets of the Markdown docs, so that tests run exactly what the docs show.

A named snippet is a fenced block preceded by ``<!-- snippet: NAME -->`` on the line above;
:func:`blocks` and :func:`all_blocks` read the fenced blocks of a section or of a page.
"""

from __future__ import annotations

import re
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
