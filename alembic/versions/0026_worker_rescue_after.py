"""Each registered worker records its ``rescue_after``: ``cyclone_workers.rescue_after``.

Revision ID: cyclone_0026_worker_rescue_after
Revises: cyclone_0025_workers
Create Date: 2026-12-08

A worker writes in its row the silence it promises not to exceed, its own
``rescue_after``; the maintenance leader judges the row, and the running jobs under the
worker's id, by that promise, not by its own ``rescue_after``: a leader with a short one
no longer takes the jobs of a live worker configured with a longer one (nor prunes its
row), and a worker with a short one is rescued after its own. A row without the column's
value (written by the code of ``cyclone_0025_workers``) and a job whose worker has no row
are judged by the leader's ``rescue_after``, as before. A nullable column without a
default: no rewrite, an instant lock of the small table.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0026_worker_rescue_after"
down_revision = "cyclone_0025_workers"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cyclone_workers", sa.Column("rescue_after", sa.Interval(), nullable=True))


def downgrade() -> None:
    op.drop_column("cyclone_workers", "rescue_after")
