"""A standalone kind's claim index leaves out its limited jobs, as a workflow's does.

Revision ID: cyclone_0022_kind_claim_index
Revises: cyclone_0021_child_items
Create Date: 2026-12-05

A job keeps the limit its kind had when it was enqueued (``limit_name``). After a deploy
that drops a kind's limit, the kind's new jobs have none, and the ordinary claim of the
kind took the earlier jobs too, ignoring the limit they were enqueued under. The claim
of a kind now reads only unlimited jobs, and ``ix_cyclone_jobs_claim_kind`` holds only
those (as ``ix_cyclone_jobs_claim_workflow`` does since cyclone_0018_step_limits): the
earlier jobs are claimed through ``ix_cyclone_jobs_gated`` by a worker that takes their
limit on. The index is rebuilt inside the upgrade's transaction, which blocks writes to
``cyclone_jobs`` while it builds (one scan of the table).
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0022_kind_claim_index"
down_revision = "cyclone_0021_child_items"
branch_labels = None
depends_on = None


def _claim_kind(predicate: str) -> None:
    op.drop_index("ix_cyclone_jobs_claim_kind", table_name="cyclone_jobs")
    op.create_index(
        "ix_cyclone_jobs_claim_kind",
        "cyclone_jobs",
        ["kind", "priority", "scheduled_at", "id"],
        postgresql_where=sa.text(predicate),
    )


def upgrade() -> None:
    _claim_kind("state = 'available' AND workflow IS NULL AND limit_name IS NULL")


def downgrade() -> None:
    _claim_kind("state = 'available' AND workflow IS NULL")
