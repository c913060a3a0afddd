"""Paused queues: ``cyclone_queues``.

Revision ID: cyclone_0012
Revises: cyclone_0011
Create Date: 2026-12-05

One row per queue an operator paused or resumed (``Client.pause_queue``,
``cyclone queues pause``): its ``name``, whether it is ``paused`` and since when
(``paused_at``, set exactly while paused). A queue with no row is not paused. The claim
reads the names of the paused queues once per statement (an InitPlan over this small
table) and leaves their jobs available. The revision touches no other table.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0012"
down_revision = "cyclone_0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cyclone_queues",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "paused = (paused_at IS NOT NULL)", name=op.f("ck_cyclone_queues_paused_at")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_cyclone_queues")),
    )


def downgrade() -> None:
    op.drop_table("cyclone_queues")
