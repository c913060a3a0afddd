"""The maintenance leader's lease: ``cyclone_leader``.

Revision ID: cyclone_0009
Revises: cyclone_0008
Create Date: 2026-12-04

One row per leadership (``maintenance``): the ``term`` of the current lease (it only
grows: each worker that takes the lease over starts the next term), its ``holder`` (a
worker id), ``expires_at``, and ``backend_pid``, the server process of the holder's last
renewal. The holder renews the lease at the start of every maintenance transaction; once
it lapses, or that server process has ended (its worker died), another worker takes it
with the next term.
Workers create the row when they first look for it; the revision touches no other table.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0009"
down_revision = "cyclone_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cyclone_leader",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("backend_pid", sa.Integer(), nullable=False),
        sa.CheckConstraint("term >= 1", name=op.f("ck_cyclone_leader_term")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_cyclone_leader")),
    )


def downgrade() -> None:
    op.drop_table("cyclone_leader")
