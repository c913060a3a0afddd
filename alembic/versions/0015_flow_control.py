"""Flow control: named concurrency and rate limits per key (Concurrency, Rate).

Revision ID: cyclone_0015
Revises: cyclone_0014
Create Date: 2026-12-05

``cyclone_limits`` holds each named limit (its ``max``, for a rate its ``per``, and what
it counts), ``cyclone_limit_keys`` one row per limit and key: the row a claim locks to
take a slot (``version``), when the key was last served (fairness), and a rate's current
window. A limited job or run keeps its limit's name and its key (``limit_name``,
``limit_key``), evaluated when it was submitted or enqueued. A run held back by its
workflow's limit waits with ``start_at = 'infinity'`` (the time it asked for in
``limit_start_at``), past the end of every claim's range. A worker claims limited jobs
through ``ix_cyclone_jobs_gated``, never through the claim indexes. Rows already in the
tables have no limit: the new columns are NULL, which rewrites no rows.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0015"
down_revision = "cyclone_0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cyclone_limits",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("max", sa.Integer(), nullable=False),
        sa.Column("per", sa.Interval(), nullable=True),
        sa.Column("on_limit", sa.Text(), server_default="queue", nullable=False),
        sa.Column("counts", sa.Text(), nullable=False),
        sa.Column("set_by_operator", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint("max >= 0", name=op.f("ck_cyclone_limits_max")),
        sa.CheckConstraint("per IS NULL OR per > interval '0'", name=op.f("ck_cyclone_limits_per")),
        sa.CheckConstraint(
            "on_limit IN ('cancel_in_progress', 'cancel_newest', 'queue')",
            name=op.f("ck_cyclone_limits_on_limit"),
        ),
        sa.CheckConstraint(
            "counts IN ('attempts', 'runs', 'starts')", name=op.f("ck_cyclone_limits_counts")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_cyclone_limits")),
    )
    op.create_table(
        "cyclone_limit_keys",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column(
            "served_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("'-infinity'::timestamp with time zone"),
            nullable=False,
        ),
        sa.Column("version", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("window_start", sa.DateTime(timezone=True), nullable=True),
        sa.Column("window_count", sa.Integer(), server_default="0", nullable=False),
        sa.ForeignKeyConstraint(
            ["name"],
            ["cyclone_limits.name"],
            name=op.f("fk_cyclone_limit_keys_name_cyclone_limits"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("name", "key", name=op.f("pk_cyclone_limit_keys")),
    )
    op.create_index(
        "ix_cyclone_limit_keys_served", "cyclone_limit_keys", ["name", "served_at", "key"]
    )
    op.add_column("cyclone_runs", sa.Column("limit_name", sa.Text(), nullable=True))
    op.add_column("cyclone_runs", sa.Column("limit_key", sa.Text(), nullable=True))
    op.add_column(
        "cyclone_runs", sa.Column("limit_start_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("cyclone_jobs", sa.Column("limit_name", sa.Text(), nullable=True))
    op.add_column("cyclone_jobs", sa.Column("limit_key", sa.Text(), nullable=True))
    op.create_index(
        "ix_cyclone_runs_held",
        "cyclone_runs",
        ["limit_name", "limit_key", "limit_start_at", "id"],
        postgresql_where=sa.text("state = 'running' AND start_at = 'infinity'"),
    )
    op.create_index(
        "ix_cyclone_runs_limited",
        "cyclone_runs",
        ["limit_name", "limit_key"],
        postgresql_where=sa.text(
            "state = 'running' AND limit_name IS NOT NULL "
            "AND (start_at IS NULL OR start_at < 'infinity')"
        ),
    )
    op.create_index(
        "ix_cyclone_jobs_gated",
        "cyclone_jobs",
        ["limit_name", "limit_key", "priority", "scheduled_at", "id"],
        postgresql_where=sa.text("state = 'available' AND limit_name IS NOT NULL"),
    )
    op.create_index(
        "ix_cyclone_jobs_gated_running",
        "cyclone_jobs",
        ["limit_name", "limit_key"],
        postgresql_where=sa.text("state = 'running' AND limit_name IS NOT NULL"),
    )


def downgrade() -> None:
    # Runs held back start as soon as they are due again; limited jobs lose their limit.
    op.execute(
        "UPDATE cyclone_runs SET start_at = coalesce(limit_start_at, now()) "
        "WHERE start_at = 'infinity'"
    )
    op.drop_index("ix_cyclone_jobs_gated_running", table_name="cyclone_jobs")
    op.drop_index("ix_cyclone_jobs_gated", table_name="cyclone_jobs")
    op.drop_index("ix_cyclone_runs_limited", table_name="cyclone_runs")
    op.drop_index("ix_cyclone_runs_held", table_name="cyclone_runs")
    op.drop_column("cyclone_jobs", "limit_key")
    op.drop_column("cyclone_jobs", "limit_name")
    op.drop_column("cyclone_runs", "limit_start_at")
    op.drop_column("cyclone_runs", "limit_key")
    op.drop_column("cyclone_runs", "limit_name")
    op.drop_index("ix_cyclone_limit_keys_served", table_name="cyclone_limit_keys")
    op.drop_table("cyclone_limit_keys")
    op.drop_table("cyclone_limits")
