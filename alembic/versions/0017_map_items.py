"""Fan-out: the items of a map node are jobs of their own (``@wf.map``).

Revision ID: cyclone_0017_map_items
Revises: cyclone_0016_child_runs
Create Date: 2026-12-05

``cyclone_jobs.item`` is the index, in the list its map node maps over, of a map item's
job; NULL for every other job. A run has one job per step (``ix_cyclone_jobs_run_id_kind``,
now partial on ``item IS NULL``) and one per item of each map node
(``ix_cyclone_jobs_run_id_kind_item``), which also serves the count and the ordered
collection of a map node's items. That one is not partial: it is the index on ``run_id``
that the foreign key's cascade (deleting a run deletes its jobs) and every read of a
run's jobs reach, which a partial index cannot serve (a purge would scan the jobs once
per run). Adding a nullable column without a default rewrites no rows; the unique index
is rebuilt.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0017_map_items"
down_revision = "cyclone_0016_child_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cyclone_jobs", sa.Column("item", sa.Integer(), nullable=True))
    op.drop_index("ix_cyclone_jobs_run_id_kind", table_name="cyclone_jobs")
    op.create_index(
        "ix_cyclone_jobs_run_id_kind",
        "cyclone_jobs",
        ["run_id", "kind"],
        unique=True,
        postgresql_where=sa.text("item IS NULL"),
    )
    op.create_index(
        "ix_cyclone_jobs_run_id_kind_item",
        "cyclone_jobs",
        ["run_id", "kind", "item"],
        unique=True,
    )


def downgrade() -> None:
    op.drop_index("ix_cyclone_jobs_run_id_kind_item", table_name="cyclone_jobs")
    op.execute("DELETE FROM cyclone_jobs WHERE item IS NOT NULL")
    op.drop_index("ix_cyclone_jobs_run_id_kind", table_name="cyclone_jobs")
    op.create_index("ix_cyclone_jobs_run_id_kind", "cyclone_jobs", ["run_id", "kind"], unique=True)
    op.drop_column("cyclone_jobs", "item")
