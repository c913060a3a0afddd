"""docs/cli.md against ``--help``: every command has a section, whose usage line is the one
``--help`` prints and whose option list names exactly the options ``--help`` shows.

A command's section is the one headed by the command in backticks (``### `cyclone runs
list```); its own part (up to the next heading) holds ``Usage: `...``` and a bullet per
option, the option's names in backticks before the first colon. The options of every
command are listed once, under "Options of every command"; of those, the groups under
``cyclone`` (``runs``, ``jobs``, ``schedules``) take only ``-h``/``--help``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from cyclone.cli import cli
from tests.support import docs

PAGE = "docs/cli.md"
COMMON = "### Options of every command"
HELP = {"-h", "--help"}
_HEADING = re.compile(r"^(#+) `(cyclone[\w -]*)`")
_OPTION_ROW = re.compile(r"^  (-[^\s,]+(?:, -[^\s,]+)*)")
_OPTION_NAME = re.compile(r"`(--?[A-Za-z][\w-]*)")


def commands(
    command: click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    """Every command of the group, the group first, as (path after ``cyclone``, command)."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from commands(sub, (*path, name))


COMMANDS = dict(commands(cli))


def shown(path: tuple[str, ...]) -> tuple[str, set[str]]:
    """The usage line and the option names that ``cyclone PATH --help`` prints."""
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="cyclone")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    usage = lines[0].removeprefix("Usage: ")
    options = lines[lines.index("Options:") + 1 :]
    names = {
        name
        for line in options
        if (row := _OPTION_ROW.match(line))
        for name in row.group(1).split(", ")
    }
    return usage, names


def documented_sections() -> dict[tuple[str, ...], list[str]]:
    """The own lines of each command's section of the page, by command path."""
    lines = (docs.ROOT / PAGE).read_text().splitlines()
    sections: dict[tuple[str, ...], list[str]] = {}
    for line in lines:
        if heading := _HEADING.match(line):
            path = tuple(heading.group(2).split()[1:])
            assert path not in sections, f"two sections for `{heading.group(2)}`"
            own = docs.section(PAGE, line)
            nested = next((i for i, text in enumerate(own) if text.startswith("#")), len(own))
            sections[path] = own[:nested]
    return sections


def bullet_options(lines: list[str]) -> set[str]:
    """The option names of the bullets ``- `--name ...`: ...`` among ``lines``."""
    return {
        name
        for line in lines
        if line.startswith("- `-")
        for name in _OPTION_NAME.findall(line.split(": ", 1)[0])
    }


def usage_line(lines: list[str]) -> str:
    (usage,) = [line for line in lines if line.startswith("Usage: ")]
    return usage.removeprefix("Usage: ").strip("`")


SECTIONS = documented_sections()


def test_every_command_of_the_cli_has_a_section_and_every_section_a_command() -> None:
    assert set(SECTIONS) == set(COMMANDS)


def common_options(path: tuple[str, ...]) -> set[str]:
    """The options of "Options of every command" that the command at ``path`` takes."""
    common = bullet_options(docs.section(PAGE, COMMON))
    subgroup = bool(path) and isinstance(COMMANDS[path], click.Group)
    return common & HELP if subgroup else common


def test_the_options_of_every_command_are_documented_once_for_all() -> None:
    assert bullet_options(docs.section(PAGE, COMMON)) == {"--url", "-v", "--verbose", *HELP}


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda path: " ".join(("cyclone", *path)))
def test_a_commands_section_shows_the_usage_and_options_that_its_help_shows(
    path: tuple[str, ...],
) -> None:
    usage, options = shown(path)
    section = SECTIONS[path]
    assert usage_line(section) == usage
    documented = bullet_options(section) | common_options(path)
    assert sorted(options - documented) == [], "shown by --help, not documented"
    assert sorted(documented - options) == [], "documented, not shown by --help"
