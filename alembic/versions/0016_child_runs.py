"""Child runs: a run records the parent run and node that submitted it (``@wf.child``).

Revision ID: cyclone_0016_child_runs
Revises: cyclone_0015
Create Date: 2026-12-05

``cyclone_runs.parent_id`` is the run whose child node submitted this run (NULL for every
other run), a foreign key that cascades: purging a parent purges its children, and the
sweeper never purges a child on its own. ``parent_node`` names that node.
``parent_waits`` is true while the parent's node waits for this run's end and has not
read it: ``ix_cyclone_runs_child_ended`` holds the ended ones, which a worker's delivery
wakes. Nullable columns without a default, and a boolean with a constant default, rewrite
no rows.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0016_child_runs"
down_revision = "cyclone_0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cyclone_runs", sa.Column("parent_id", sa.Uuid(), nullable=True))
    op.add_column("cyclone_runs", sa.Column("parent_node", sa.Text(), nullable=True))
    op.add_column(
        "cyclone_runs",
        sa.Column("parent_waits", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    op.create_foreign_key(
        op.f("fk_cyclone_runs_parent_id_cyclone_runs"),
        "cyclone_runs",
        "cyclone_runs",
        ["parent_id"],
        ["id"],
        ondelete="CASCADE",
    )
    op.create_index(
        "ix_cyclone_runs_parent",
        "cyclone_runs",
        ["parent_id", "parent_node"],
        postgresql_where=sa.text("parent_id IS NOT NULL"),
    )
    op.create_index(
        "ix_cyclone_runs_child_ended",
        "cyclone_runs",
        ["id"],
        postgresql_where=sa.text("parent_waits AND state <> 'running'"),
    )


def downgrade() -> None:
    op.drop_index("ix_cyclone_runs_child_ended", table_name="cyclone_runs")
    op.drop_index("ix_cyclone_runs_parent", table_name="cyclone_runs")
    op.drop_constraint(
        op.f("fk_cyclone_runs_parent_id_cyclone_runs"), "cyclone_runs", type_="foreignkey"
    )
    op.drop_column("cyclone_runs", "parent_waits")
    op.drop_column("cyclone_runs", "parent_node")
    op.drop_column("cyclone_runs", "parent_id")
