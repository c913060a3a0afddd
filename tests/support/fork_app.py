"""The fixed definition ``cyclone runs fork --app tests.support.fork_app`` forks onto."""

from __future__ import annotations

from collections import Counter

from tests.support.fork_defs import three_steps

WORKFLOW = "cli.fork.order"

fixed = three_steps(WORKFLOW, Counter(), fixed=True)
