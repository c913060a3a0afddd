"""The blocks of docs/flow-control.md run as shown."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tests.support.docs import blocks

PAGE = "docs/flow-control.md"


def test_every_block_of_the_flow_control_page_runs(engine: sa.Engine) -> None:
    namespace: dict[str, Any] = {"engine": engine}
    found = blocks(PAGE, "## Examples")
    assert len(found) == 3
    for block in found:
        exec(compile(block, PAGE, "exec"), namespace)
    client = namespace["client"]
    runs = client.list_runs(workflow="docs.checkout")
    assert {run.state for run in runs} == {"completed"}
    (provider,) = [s for s in client.list_limits() if s.name == "docs.provider"]
    assert (provider.max, provider.set_by_operator, provider.counts) == (3, True, "attempts")
    with engine.connect() as conn:
        keys = conn.execute(
            sa.text("SELECT DISTINCT workflow FROM cyclone_jobs WHERE limit_name = 'docs.provider'")
        ).scalars()
        assert set(keys) == {"docs.checkout", "docs.refunds"}
