"""A run records the run it was forked from (``run.fork``).

Revision ID: cyclone_0014
Revises: cyclone_0013
Create Date: 2026-12-10

``cyclone_runs.forked_from`` is the id of the run a fork was made from, NULL for every
other run. It is no foreign key: the source run may be purged before its fork, and the
fork keeps naming it (a purge need not look for forks). Adding a nullable column without
a default rewrites no rows.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0014"
down_revision = "cyclone_0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cyclone_runs", sa.Column("forked_from", sa.Uuid(), nullable=True))


def downgrade() -> None:
    op.drop_column("cyclone_runs", "forked_from")
