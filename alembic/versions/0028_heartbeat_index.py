"""The heartbeats' index is partial on the heartbeat, not on the running state.

Revision ID: cyclone_0028_heartbeat_index
Revises: cyclone_0027_ordered_run_ids
Create Date: 2026-12-06

``ix_cyclone_jobs_heartbeat_at`` serves the rescue (running jobs whose heartbeat is
older than their worker promised). It held the rows ``WHERE state = 'running'``, so the
statements that guard on that state while they find their jobs by id (a worker's record
of its successes, its heartbeat) could read it too, and the planner, counting a few
running jobs, combined it with their lookup by id. But every job that ran since the last
vacuum leaves an entry in it, and a bitmap scan reads them all: a worker draining a
backlog spent more in each record the more jobs it had run. A job has a heartbeat
exactly while it runs, so the index now holds the rows ``WHERE heartbeat_at IS NOT
NULL``: the same rows, which only a condition on the heartbeat reaches. The index is
rebuilt inside the upgrade's transaction, which blocks writes to ``cyclone_jobs`` while
it builds (one scan of the table).
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0028_heartbeat_index"
down_revision = "cyclone_0027_ordered_run_ids"
branch_labels = None
depends_on = None


def _heartbeat_index(predicate: str) -> None:
    op.drop_index("ix_cyclone_jobs_heartbeat_at", table_name="cyclone_jobs")
    op.create_index(
        "ix_cyclone_jobs_heartbeat_at",
        "cyclone_jobs",
        ["heartbeat_at"],
        postgresql_where=sa.text(predicate),
    )


def upgrade() -> None:
    _heartbeat_index("heartbeat_at IS NOT NULL")


def downgrade() -> None:
    _heartbeat_index("state = 'running'")
