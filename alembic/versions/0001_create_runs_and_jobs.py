"""Create cyclone_runs and cyclone_jobs.

Revision ID: cyclone_0001
Revises:
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "cyclone_0001"
down_revision = None
branch_labels = ("cyclone",)
depends_on = None

RUN_STATES = "'cancelled', 'completed', 'failed', 'running'"
RUN_TERMINAL = "'cancelled', 'completed', 'failed'"
JOB_STATES = "'available', 'blocked', 'cancelled', 'completed', 'failed', 'running'"
JOB_TERMINAL = "'cancelled', 'completed', 'failed'"


def upgrade() -> None:
    op.create_table(
        "cyclone_runs",
        sa.Column("id", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("workflow", sa.Text(), nullable=False),
        sa.Column("submit_key", sa.Text(), nullable=True),
        sa.Column("input", postgresql.JSONB(), nullable=False),
        sa.Column("graph", postgresql.JSONB(), nullable=False),
        sa.Column("result_step", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), server_default="running", nullable=False),
        sa.Column("steps_remaining", sa.Integer(), nullable=False),
        sa.Column("failed_step", sa.Text(), nullable=True),
        sa.Column("error", postgresql.JSONB(), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retention", sa.Interval(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("finalized_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"state IN ({RUN_STATES})", name=op.f("ck_cyclone_runs_state")),
        sa.CheckConstraint(
            f"(state IN ({RUN_TERMINAL})) = (finalized_at IS NOT NULL)",
            name=op.f("ck_cyclone_runs_finalized_at"),
        ),
        sa.CheckConstraint("steps_remaining >= 0", name=op.f("ck_cyclone_runs_steps_remaining")),
        sa.PrimaryKeyConstraint("id", name="pk_cyclone_runs"),
    )
    op.create_index("idx_runs_submit_key", "cyclone_runs", ["workflow", "submit_key"], unique=True)
    op.create_index("ix_cyclone_runs_created_at_id", "cyclone_runs", ["created_at", "id"])
    op.create_index(
        "ix_cyclone_runs_workflow_created_at", "cyclone_runs", ["workflow", "created_at"]
    )
    op.create_index(
        "ix_cyclone_runs_finalized_at",
        "cyclone_runs",
        ["finalized_at"],
        postgresql_where=sa.text("finalized_at IS NOT NULL"),
    )
    op.create_index(
        "ix_cyclone_runs_deadline",
        "cyclone_runs",
        ["deadline"],
        postgresql_where=sa.text("state = 'running' AND deadline IS NOT NULL"),
    )

    op.create_table(
        "cyclone_jobs",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=True),
        sa.Column("workflow", sa.Text(), nullable=True),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), server_default="default", nullable=False),
        sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("args", postgresql.JSONB(), nullable=True),
        sa.Column("output", postgresql.JSONB(), nullable=True),
        sa.Column("deps", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
        sa.Column("pending_deps", sa.Integer(), server_default="0", nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column(
            "errors", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column("unique_key", sa.Text(), nullable=True),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
        sa.Column("worker_id", sa.Text(), nullable=True),
        sa.Column(
            "scheduled_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("attempted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finalized_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(f"state IN ({JOB_STATES})", name=op.f("ck_cyclone_jobs_state")),
        sa.CheckConstraint(
            f"(state IN ({JOB_TERMINAL})) = (finalized_at IS NOT NULL)",
            name=op.f("ck_cyclone_jobs_finalized_at"),
        ),
        sa.CheckConstraint("max_attempts > 0", name=op.f("ck_cyclone_jobs_max_attempts")),
        sa.CheckConstraint(
            "attempt >= 0 AND attempt <= max_attempts", name=op.f("ck_cyclone_jobs_attempt")
        ),
        sa.CheckConstraint(
            "(run_id IS NULL) = (workflow IS NULL)", name=op.f("ck_cyclone_jobs_run_or_standalone")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["cyclone_runs.id"],
            name="fk_cyclone_jobs_run_id_cyclone_runs",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_cyclone_jobs"),
    )
    op.create_index(
        "ix_cyclone_jobs_claim",
        "cyclone_jobs",
        ["priority", "scheduled_at", "id"],
        postgresql_where=sa.text("state = 'available'"),
    )
    op.create_index("ix_cyclone_jobs_run_id_kind", "cyclone_jobs", ["run_id", "kind"], unique=True)
    op.create_index(
        "ix_cyclone_jobs_unique_key",
        "cyclone_jobs",
        ["kind", "unique_key"],
        unique=True,
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND state IN ('available', 'blocked', 'running')"
        ),
    )
    op.create_index(
        "ix_cyclone_jobs_heartbeat_at",
        "cyclone_jobs",
        ["heartbeat_at"],
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_index(
        "ix_cyclone_jobs_standalone_finalized_at",
        "cyclone_jobs",
        ["finalized_at"],
        postgresql_where=sa.text("run_id IS NULL AND finalized_at IS NOT NULL"),
    )
    op.create_index(
        "ix_cyclone_jobs_created_at_id",
        "cyclone_jobs",
        ["created_at", "id"],
        postgresql_where=sa.text("run_id IS NULL"),
    )

    # Notifications come from triggers, so every path that changes a state rings the bell.
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
    op.execute(
        """
        CREATE FUNCTION cyclone_notify_job_changed() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.state = 'available' THEN
                PERFORM pg_notify('cyclone_jobs_available', '');
            ELSE
                PERFORM pg_notify('cyclone_run_finished', 'job:' || NEW.id);
            END IF;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER cyclone_jobs_state_changed AFTER UPDATE OF state ON cyclone_jobs
        FOR EACH ROW WHEN (
            OLD.state IS DISTINCT FROM NEW.state AND (
                NEW.state = 'available'
                OR (NEW.run_id IS NULL AND NEW.state IN ('completed', 'failed', 'cancelled'))
            )
        )
        EXECUTE FUNCTION cyclone_notify_job_changed()
        """
    )
    op.execute(
        """
        CREATE FUNCTION cyclone_notify_run_finished() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('cyclone_run_finished', NEW.id::text);
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER cyclone_runs_finished AFTER UPDATE OF state ON cyclone_runs
        FOR EACH ROW WHEN (OLD.state = 'running' AND NEW.state <> 'running')
        EXECUTE FUNCTION cyclone_notify_run_finished()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS cyclone_runs_finished ON cyclone_runs")
    op.execute("DROP TRIGGER IF EXISTS cyclone_jobs_state_changed ON cyclone_jobs")
    op.execute("DROP TRIGGER IF EXISTS cyclone_jobs_inserted ON cyclone_jobs")
    op.execute("DROP FUNCTION IF EXISTS cyclone_notify_run_finished()")
    op.execute("DROP FUNCTION IF EXISTS cyclone_notify_job_changed()")
    op.execute("DROP FUNCTION IF EXISTS cyclone_notify_jobs_inserted()")
    op.drop_table("cyclone_jobs")
    op.drop_table("cyclone_runs")
