"""Index listing by workflow so key lookups cannot use it; notify per inserted available job.

Revision ID: cyclone_0002
Revises: cyclone_0001
Create Date: 2026-12-02

Without statistics (a fresh deploy, or autovacuum off) the planner ties a key lookup,
``workflow = $1 AND submit_key = $2``, between the unique key index and
``(workflow, created_at)``, and a prepared statement may keep a plan that filters every
run of the workflow. The listing index is now partial on ``created_at IS NOT NULL``
(always true; listings state it), which a key lookup does not imply.

The insert trigger was statement-level over a transition table, so it ran for every
insert statement, even one inserting nothing (a duplicate submit). It is now a row
trigger with a ``WHEN`` clause: no function call unless an available job was inserted.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0002"
down_revision = "cyclone_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_cyclone_runs_workflow_created_at", table_name="cyclone_runs")
    op.create_index(
        "ix_cyclone_runs_workflow_created_at_id",
        "cyclone_runs",
        ["workflow", "created_at", "id"],
        postgresql_where=sa.text("created_at IS NOT NULL"),
    )
    op.execute("DROP TRIGGER cyclone_jobs_inserted ON cyclone_jobs")
    op.execute("DROP FUNCTION cyclone_notify_jobs_inserted()")
    op.execute(
        """
        CREATE TRIGGER cyclone_jobs_inserted AFTER INSERT ON cyclone_jobs
        FOR EACH ROW WHEN (NEW.state = 'available')
        EXECUTE FUNCTION cyclone_notify_job_changed()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER cyclone_jobs_inserted ON cyclone_jobs")
    op.execute(
        """
        CREATE FUNCTION cyclone_notify_jobs_inserted() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF EXISTS (SELECT 1 FROM inserted WHERE state = 'available') THEN
                PERFORM pg_notify('cyclone_jobs_available', '');
            END IF;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER cyclone_jobs_inserted AFTER INSERT ON cyclone_jobs
        REFERENCING NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION cyclone_notify_jobs_inserted()
        """
    )
    op.drop_index("ix_cyclone_runs_workflow_created_at_id", table_name="cyclone_runs")
    op.create_index(
        "ix_cyclone_runs_workflow_created_at", "cyclone_runs", ["workflow", "created_at"]
    )
