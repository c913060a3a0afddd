"""The ``cyclone`` command line (click, with rich on a terminal), in the optional ``cli`` extra.

``main`` works without click installed: it then prints one line naming the extra. The
command group itself is built by :func:`build_cli`, which Flask and Django mount under
their own command lines.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cyclone.cli._app import build_cli, cli

__all__ = ["build_cli", "cli", "main"]

MISSING_EXTRA = "cyclone: the command line needs the cli extra: pip install 'cyclone[cli]'"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``cyclone`` command (the console script and ``python -m cyclone``)."""
    try:
        from cyclone.cli import _app
    except ModuleNotFoundError as exc:
        if exc.name != "click":
            raise
        print(MISSING_EXTRA, file=sys.stderr)
        return 2
    return _app.run(argv)


def __getattr__(name: str) -> Any:
    if name in ("build_cli", "cli"):
        from cyclone.errors import MissingExtraError

        with MissingExtraError.guard(__name__, "cli"):
            from cyclone.cli import _app

        return getattr(_app, name)
    raise AttributeError(f"module 'cyclone.cli' has no attribute {name!r}")
