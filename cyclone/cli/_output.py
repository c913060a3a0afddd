"""How the command line prints: rich tables on a terminal, plain columns when piped, JSON lines.

rich is optional at run time (Flask's and Django's command lines bring click, not rich):
without it, or when stdout is not a terminal, tables are plain space-aligned columns.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import msgspec

STATE_STYLES = {
    "running": "cyan",
    "available": "blue",
    "blocked": "dim",
    "completed": "green",
    "failed": "bold red",
    "cancelled": "yellow",
}


def _console() -> Any:
    """A rich Console writing to stdout, or None (not a terminal, or rich missing)."""
    if not sys.stdout.isatty():
        return None
    try:
        from rich.console import Console
    except ModuleNotFoundError:
        return None
    return Console(file=sys.stdout, highlight=False)


def when(value: datetime | None) -> str:
    """A timestamp as UTC, to the second."""
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def duration(value: timedelta | None) -> str:
    """A duration short enough for a table column (``850ms``, ``12.3s``, ``4m05s``, ``2h03m``)."""
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def json_line(record: Any) -> None:
    """One JSON object on one line (datetimes ISO 8601, durations in seconds)."""

    click.echo(msgspec.json.encode(_seconds(record)).decode())


def _seconds(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, dict):
        return {k: _seconds(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_seconds(v) for v in value]
    return value


Column = tuple[str, Callable[[Any], str]]


def table(columns: Sequence[Column], items: Sequence[Any], *, state: str | None = "STATE") -> None:
    """Print ``items`` as a table: a header, then one row per item."""
    headers = [header for header, _ in columns]
    rows = [[cell(item) for _, cell in columns] for item in items]
    console = _console()
    if console is not None:
        from rich.table import Table

        grid = Table(box=None, header_style="bold", pad_edge=False)
        for header in headers:
            grid.add_column(header, overflow="fold")
        for row in rows:
            styled = [
                f"[{STATE_STYLES.get(value, '')}]{value}[/]"
                if header == state and value in STATE_STYLES
                else _escape(value)
                for header, value in zip(headers, row, strict=True)
            ]
            grid.add_row(*styled)
        console.print(grid)
        return
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    for row in [headers, *rows]:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def fields(pairs: Sequence[tuple[str, str]]) -> None:
    """Print ``name: value`` lines, names aligned (a show command's header)."""
    width = max(len(name) for name, _ in pairs)
    console = _console()
    for name, value in pairs:
        if console is not None:
            style = STATE_STYLES.get(value, "") if name == "state" else ""
            text = f"[{style}]{_escape(value)}[/]" if style else _escape(value)
            console.print(f"[bold]{name.ljust(width)}[/]  {text}")
        else:
            click.echo(f"{name.ljust(width)}  {value}")


def heading(text: str) -> None:
    console = _console()
    if console is not None:
        console.print(f"\n[bold underline]{_escape(text)}[/]")
    else:
        click.echo(f"\n{text}")


def block(text: str, *, indent: str = "    ") -> None:
    """Print a multi-line text (JSON, a traceback) indented, verbatim."""
    for line in text.rstrip().splitlines():
        click.echo(f"{indent}{line}")


def pretty_json(value: Any) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def _escape(value: str) -> str:
    from rich.markup import escape

    return escape(value)


@contextmanager
def progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal (nothing when piped); yields ``advance(n)``."""
    console = _console()
    if console is None or total == 0:
        yield lambda n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console
    ) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)
