"""Named code snippets of the Markdown docs, so that tests run exactly what the docs show.

A snippet is a fenced block preceded by ``<!-- snippet: NAME -->`` on the line above.
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
