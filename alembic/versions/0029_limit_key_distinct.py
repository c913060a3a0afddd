"""The planner counts a limit's keys as many: ``n_distinct`` of ``limit_key`` is -1.

Revision ID: cyclone_0029_limit_key_distinct
Revises: cyclone_0028_heartbeat_index
Create Date: 2026-12-06

A limited claim probes each key at the front of its limit's order for a due job (the
admission of held runs does the same over the runs). A key served long ago with no job
left, a customer done with, sits at that front. Where the statistics say a few keys hold
many rows each (a burst from a few customers, then ``ANALYZE``), the planner expects a
sequential scan to find such a key's first row within a few rows, and reads the whole
table for each key that has none. Declaring every key distinct (``n_distinct = -1`` on
``cyclone_jobs.limit_key`` and ``cyclone_runs.limit_key``) makes each probe an index
probe, whatever the statistics.

It takes effect at the next ``ANALYZE`` of the tables (autovacuum's, or by hand); until
then nothing changes. Only the columns' statistics options change: no row is rewritten.
"""

from alembic import op

revision = "cyclone_0029_limit_key_distinct"
down_revision = "cyclone_0028_heartbeat_index"
branch_labels = None
depends_on = None

UPGRADE = (
    "ALTER TABLE cyclone_jobs ALTER COLUMN limit_key SET (n_distinct = -1)",
    "ALTER TABLE cyclone_runs ALTER COLUMN limit_key SET (n_distinct = -1)",
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
