"""A signal sent to a parked wait node is delivered by the next claim, not by its sender.

Revision ID: cyclone_0010
Revises: cyclone_0009
Create Date: 2026-12-04

``cyclone_signals.wake_pending`` marks a signal whose wait node had parked when it was
sent: the sender writes the signal row only (a sender's transaction, the caller's own,
may stay open for long, and must hold no lock a worker waits on), and the next claim
makes the node available (see :mod:`cyclone._store.waits`). The partial index is what a
claim reads: the signals still to deliver, almost always none. Rows already in the table
were delivered by their senders: the column defaults to false, which rewrites no rows.

The downgrade delivers the signals still pending, as a sender before this revision did.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0010"
down_revision = "cyclone_0009"
branch_labels = None
depends_on = None

_DELIVER_PENDING = """
UPDATE cyclone_jobs j
SET scheduled_at = now(),
    state = CASE WHEN j.state = 'blocked' AND j.pending_deps = 0 THEN 'available'
                 ELSE j.state END
FROM cyclone_signals s
WHERE s.wake_pending AND j.run_id = s.run_id
  AND j.args = jsonb_build_object('signal', s.name)
  AND j.state IN ('blocked', 'available')
"""


def upgrade() -> None:
    op.add_column(
        "cyclone_signals",
        sa.Column("wake_pending", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.create_index(
        "ix_cyclone_signals_wake_pending",
        "cyclone_signals",
        ["run_id", "name"],
        postgresql_where=sa.text("wake_pending"),
    )


def downgrade() -> None:
    op.execute(_DELIVER_PENDING)
    op.drop_index("ix_cyclone_signals_wake_pending", table_name="cyclone_signals")
    op.drop_column("cyclone_signals", "wake_pending")
