"""Definitions loaded by ``cyclone worker tests.support.cli_app`` in the CLI tests."""

from __future__ import annotations

import os

import cyclone

hello = cyclone.ResultWorkflow(os.environ.get("CYCLONE_CLI_WORKFLOW", "cli.hello"), output=str)


@hello.result()
def greet(ctx: cyclone.StepContext, name: str) -> str:
    return f"hello {name}"
