"""Flow control on workflow steps: a step's Concurrency or Rate, keyed per run.

Revision ID: cyclone_0018_step_limits
Revises: cyclone_0017_map_items
Create Date: 2026-12-05

A run keeps, in ``step_limits``, the limit name and key of each of its limited steps
(``{step: {"n": name, "k": key}}``), evaluated on its input when it was submitted; the
claim that starts the run copies them onto the steps' jobs, so a redeploy cannot change
a run's groups. A limited step is claimed through ``ix_cyclone_jobs_gated``: the
workflow claim index leaves it out (``limit_name IS NULL``). Existing rows have no step
limits: the new columns are NULL, which rewrites no rows. A step or step kind given both
a Concurrency and a Rate keeps the Rate's name and key in ``rate_name``, ``rate_key``.
"""

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "cyclone_0018_step_limits"
down_revision = "cyclone_0017_map_items"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "cyclone_runs",
        sa.Column("step_limits", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("cyclone_jobs", sa.Column("rate_name", sa.Text(), nullable=True))
    op.add_column("cyclone_jobs", sa.Column("rate_key", sa.Text(), nullable=True))
    op.drop_index("ix_cyclone_jobs_claim_workflow", table_name="cyclone_jobs")
    op.create_index(
        "ix_cyclone_jobs_claim_workflow",
        "cyclone_jobs",
        ["workflow", "priority", "scheduled_at", "id"],
        postgresql_where=sa.text(
            "state = 'available' AND workflow IS NOT NULL AND limit_name IS NULL"
        ),
    )


def downgrade() -> None:
    # Limited steps lose their limit: the workflow claim index serves them again.
    op.execute(
        "UPDATE cyclone_jobs SET limit_name = NULL, limit_key = NULL "
        "WHERE run_id IS NOT NULL AND limit_name IS NOT NULL"
    )
    op.drop_index("ix_cyclone_jobs_claim_workflow", table_name="cyclone_jobs")
    op.create_index(
        "ix_cyclone_jobs_claim_workflow",
        "cyclone_jobs",
        ["workflow", "priority", "scheduled_at", "id"],
        postgresql_where=sa.text("state = 'available' AND workflow IS NOT NULL"),
    )
    op.drop_column("cyclone_jobs", "rate_key")
    op.drop_column("cyclone_jobs", "rate_name")
    op.drop_column("cyclone_runs", "step_limits")
