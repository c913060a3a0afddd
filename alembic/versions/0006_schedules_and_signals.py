"""Keys and time: ``cyclone_schedules`` (schedules) and ``cyclone_signals`` (signals).

Revision ID: cyclone_0006
Revises: cyclone_0005
Create Date: 2026-12-03

One row per schedule, by name: what a Worker serving its workflow registered (the
workflow, a cron expression or an interval, the time zone, the missed-tick policy),
whether it is paused, and ``last_tick``, the latest tick fired. A worker fires a tick
in the transaction that moves ``last_tick`` past it, holding the row's lock, so a tick
is fired once and a crash before the commit leaves it to be fired again.

``cyclone_signals`` keeps the signals sent to a run, one per (run, name), first payload
kept, deleted with the run; a row without a payload marks a wait node that is waiting
(until ``wait_until``, its timeout). The revision touches no other table.
"""

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "cyclone_0006"
down_revision = "cyclone_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cyclone_schedules",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("workflow", sa.Text(), nullable=False),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("every", sa.Interval(), nullable=True),
        sa.Column("timezone", sa.Text(), nullable=False),
        sa.Column("missed", sa.Text(), nullable=False),
        sa.Column("max_catch_up", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("last_tick", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "(cron IS NULL) <> (every IS NULL)", name=op.f("ck_cyclone_schedules_cron_or_every")
        ),
        sa.CheckConstraint(
            "missed IN ('catch_up', 'latest')", name=op.f("ck_cyclone_schedules_missed")
        ),
        sa.CheckConstraint("max_catch_up >= 1", name=op.f("ck_cyclone_schedules_max_catch_up")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_cyclone_schedules")),
    )

    op.create_table(
        "cyclone_signals",
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("wait_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.CheckConstraint(
            "(payload IS NULL) = (sent_at IS NULL)", name=op.f("ck_cyclone_signals_sent")
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["cyclone_runs.id"],
            name=op.f("fk_cyclone_signals_run_id_cyclone_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", "name", name=op.f("pk_cyclone_signals")),
    )


def downgrade() -> None:
    op.drop_table("cyclone_signals")
    op.drop_table("cyclone_schedules")
