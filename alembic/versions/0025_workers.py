"""The registry of running workers: ``cyclone_workers``.

Revision ID: cyclone_0025_workers
Revises: cyclone_0024_claim_statistics
Create Date: 2026-12-07

One row per running worker, keyed by its id (``host:pid:hex``): what it serves
(``queues``, NULL for every queue; ``workflows``; ``steps``, the standalone step kinds),
its ``concurrency``, the cyclone ``version`` it runs, when it started, its last
``heartbeat_at`` and, once it began to stop, ``stopping_at``. A worker writes its row
when it starts, beats it from its heartbeat thread and deletes it when it stops; the
maintenance leader deletes the rows of workers silent for longer than ``rescue_after``
(killed, frozen). A new table, so nothing else is locked; code older than this revision
does not register its workers.
"""

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "cyclone_0025_workers"
down_revision = "cyclone_0024_claim_statistics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cyclone_workers",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "heartbeat_at",
            sa.DateTime(timezone=True),
            server_default=sa.func.now(),
            nullable=False,
        ),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("workflows", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("steps", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("stopping_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_cyclone_workers")),
    )


def downgrade() -> None:
    op.drop_table("cyclone_workers")
