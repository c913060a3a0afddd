"""The planner counts a limit's keys as many: ``n_distinct`` of ``limit_key`` is 10,000.

Revision ID: cyclone_0029_limit_key_distinct
Revises: cyclone_0028_heartbeat_index
Create Date: 2026-12-06

A limited claim probes each key at the front of its limit's order for a due job (the
admission of held runs does the same over the runs). A key served long ago with no job
left, a customer done with, sits at that front. Where the statistics say a few keys hold
many rows each (a burst from a few customers, then ``ANALYZE``), the planner expected a
sequential scan to find such a key's first row within a few rows, and read the whole
table for each key that has none. With ``n_distinct`` of ``limit_key`` set to 10,000 on
``cyclone_jobs`` and ``cyclone_runs``, a scan is expected to read some ten thousand rows
before a key's first, whatever the table's size, and each probe is an index probe. A
fixed count rather than -1 ("every row its own key"): the operators' listing of limits
groups the waiting rows by key, and expecting a group per row it sorted the whole
backlog (three times slower at a million jobs) where it hashes a few keys.

The option takes effect at an ``ANALYZE``: the upgrade analyzes both tables unless they
are empty (an empty table's first statistics come from autovacuum, as before). No row is
rewritten; ``ANALYZE`` reads a sample and blocks no writes.
"""

from alembic import op

revision = "cyclone_0029_limit_key_distinct"
down_revision = "cyclone_0028_heartbeat_index"
branch_labels = None
depends_on = None

UPGRADE = (
    "ALTER TABLE cyclone_jobs ALTER COLUMN limit_key SET (n_distinct = 10000)",
    "ALTER TABLE cyclone_runs ALTER COLUMN limit_key SET (n_distinct = 10000)",
    "DO $$ BEGIN IF EXISTS (SELECT FROM cyclone_jobs) THEN ANALYZE cyclone_jobs; END IF; END $$",
    "DO $$ BEGIN IF EXISTS (SELECT FROM cyclone_runs) THEN ANALYZE cyclone_runs; END IF; END $$",
)
DOWNGRADE = (
    "ALTER TABLE cyclone_jobs ALTER COLUMN limit_key RESET (n_distinct)",
    "ALTER TABLE cyclone_runs ALTER COLUMN limit_key RESET (n_distinct)",
)


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
