"""``manage.py cyclone ...``: cyclone's command line, on the project's database and definitions.

Everything after ``cyclone`` goes to the same click group as the ``cyclone`` console
script (``worker``, ``migrate``, ``runs``, ``jobs``, ...), with the Engine of
``settings.CYCLONE_DATABASE``, the workflows found in the apps' ``workflows`` modules,
and Django's connection housekeeping around each step.
"""

from __future__ import annotations

import os
import sys
from argparse import REMAINDER, ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from cyclone.contrib.django import _discovery, _engines, _steps
from cyclone.errors import MissingExtraError

with MissingExtraError.guard(__name__, "django"):
    import click

    from cyclone.cli import build_cli


def group() -> click.Group:
    """The click group ``manage.py cyclone`` runs."""
    return build_cli(
        engine=_engines.engine,
        definitions=_discovery.definitions,
        worker_options=lambda: {"step_context": _steps.step_context},
        name="cyclone",
        database=(
            "the project's: the DATABASES alias that settings.CYCLONE_DATABASE names "
            '(default "default")'
        ),
    )


class Command(BaseCommand):
    help = "cyclone's command line (worker, migrate, runs, jobs, ...) on this project's database"

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("args", nargs=REMAINDER, help="a cyclone command and its options")

    def run_from_argv(self, argv: list[str]) -> None:
        """Hand the arguments to click untouched (its options are not Django's); exit with its code.

        Errors are one line on stderr, as from the ``cyclone`` console script.
        """
        prog = f"{os.path.basename(argv[0])} {argv[1]}"
        try:
            result = group().main(args=argv[2:], prog_name=prog, standalone_mode=False)
            code = result if isinstance(result, int) else 0
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else prog
            click.echo(f"cyclone: {exc.format_message()} (see '{where} --help')", err=True)
            code = exc.exit_code
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
        except (click.Abort, KeyboardInterrupt):
            click.echo("cyclone: interrupted", err=True)
            code = 130
        finally:
            _engines.close_engines()
            connections.close_all()
        sys.exit(code)

    def handle(self, *args: Any, **options: Any) -> None:
        """``call_command("cyclone", "worker", "--drain")``: the same, raising CommandError."""
        try:
            result = group().main(args=list(args), prog_name="cyclone", standalone_mode=False)
        except click.exceptions.Exit as exc:
            result = exc.exit_code
        except click.ClickException as exc:
            raise CommandError(exc.format_message()) from exc
        if isinstance(result, int) and result != 0:
            raise CommandError(f"cyclone {' '.join(args)} exited with status {result}")
