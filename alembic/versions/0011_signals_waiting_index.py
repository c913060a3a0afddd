"""The markers of parked wait nodes, indexed: the runs waiting for a signal are found fast.

Revision ID: cyclone_0011
Revises: cyclone_0010
Create Date: 2026-12-05

A wait node that parks leaves a marker, its signal's row without a payload (see
:mod:`cyclone._store.waits`). ``Client.list_runs(parked="waiting")``,
``count_parked_runs()`` and the dashboard's overview read the runs waiting for a signal
from this partial index: it holds the markers only, so the read costs the runs that wait,
not every signal ever sent.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0011"
down_revision = "cyclone_0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_cyclone_signals_waiting",
        "cyclone_signals",
        ["run_id"],
        postgresql_where=sa.text("payload IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_cyclone_signals_waiting", table_name="cyclone_signals")
