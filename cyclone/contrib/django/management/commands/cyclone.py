"""``manage.py cyclone ...``: cyclone's command line, on the project's database and definitions.

Everything after ``cyclone`` goes to the same click group as the ``cyclone`` console
script (``worker``, ``migrate``, ``runs``, ``jobs``, ...), with the Engine of
``settings.CYCLONE_DATABASE``, the workflows found in the apps' ``workflows`` modules,
and Django's connection housekeeping around each step.
"""

from __future__ import annotations

import functools
import os
import sys
from argparse import REMAINDER, ArgumentParser
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from cyclone.contrib.django import _discovery, _engines, _steps
from cyclone.errors import MissingExtraError

with MissingExtraError.guard(__name__, "django"):
    import click

    from cyclone.cli import build_cli
    from cyclone.cli._app import run_group
    from cyclone.cli._db import BadInput

T = TypeVar("T")


def _settings(factory: Callable[[], T]) -> Callable[[], T]:
    """``factory``, its ImproperlyConfigured (a settings mistake: an alias DATABASES lacks,
    a setting of the wrong type) turned into bad usage: one line, exit status 2, as a bad
    ``--url`` or MODULE is for the ``cyclone`` program."""

    @functools.wraps(factory)
    def call() -> T:
        try:
            return factory()
        except ImproperlyConfigured as exc:
            raise BadInput(str(exc).removeprefix("cyclone: ")) from exc

    return call


def group() -> click.Group:
    """The click group ``manage.py cyclone`` runs."""
    return build_cli(
        engine=_settings(_engines.engine),
        definitions=_settings(_discovery.definitions),
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
            code = run_group(group(), argv[2:], prog)
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
