"""Definitions loaded by ``cyclone worker tests.support.cli_app`` in the CLI tests.

``CYCLONE_CLI_STEP_SECONDS`` makes the step take that long (the work a grace period
lets finish).
"""

from __future__ import annotations

import os
import time

import cyclone

hello = cyclone.ResultWorkflow(os.environ.get("CYCLONE_CLI_WORKFLOW", "cli.hello"), output=str)


@hello.result()
def greet(ctx: cyclone.StepContext, name: str) -> str:
    time.sleep(float(os.environ.get("CYCLONE_CLI_STEP_SECONDS", "0")))  # the step's work
    return f"hello {name}"
