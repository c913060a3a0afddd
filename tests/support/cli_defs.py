"""Definitions for ``cyclone worker tests.support.cli_defs[:ATTR]`` in the CLI tests.

``first`` and ``second`` are two workflows; ``both`` lists them; ``mail`` is a standalone
step kind; ``not_a_definition`` is a plain value, for the error naming it.
"""

from __future__ import annotations

from typing import Any

import cyclone

first = cyclone.ResultWorkflow("cli.defs.first", output=str)
second = cyclone.ResultWorkflow("cli.defs.second", output=str)


@first.result()
def first_step(ctx: cyclone.StepContext, value: Any) -> str:
    return f"first {value}"


@second.result()
def second_step(ctx: cyclone.StepContext, value: Any) -> str:
    return f"second {value}"


@cyclone.step("cli.defs.mail", queue="cli.defs.mail")
def mail(ctx: cyclone.StepContext, to: str) -> str:
    return f"sent to {to}"


both = [first, second]
not_a_definition = 42
