"""Jobs carry a lease, the fence of their current owner, and count attempts lost apart.

Revision ID: cyclone_0005
Revises: cyclone_0004
Create Date: 2026-12-03

``lease`` grows by one on every claim and every hand-back (a rescue, a worker stopping),
and is never reset, so an owner that lost its job cannot pass the fence again: every
outcome, heartbeat and ``ctx.cancelled()`` compares it. ``lost`` counts the attempts lost
with a worker (rescued after ``rescue_after``), which do not count as attempts of the
step; it was read from the ``WorkerLost`` records of ``errors`` before, and is filled
from them here.

Deploy the code that carries the lease with this revision: older workers neither bump
nor compare it.
"""

from alembic import op

revision = "cyclone_0005"
down_revision = "cyclone_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE cyclone_jobs
            ADD COLUMN lease bigint NOT NULL DEFAULT 0,
            ADD COLUMN lost integer NOT NULL DEFAULT 0,
            ADD CONSTRAINT ck_cyclone_jobs_lost CHECK (lost >= 0)
        """
    )
    op.execute(
        """
        UPDATE cyclone_jobs
        SET lost = jsonb_array_length(
                jsonb_path_query_array(errors, '$[*] ? (@.type == "WorkerLost")')
            ),
            lease = attempt
        WHERE errors @> '[{"type": "WorkerLost"}]' OR attempt > 0
        """
    )


def downgrade() -> None:
    op.execute(
        """
        ALTER TABLE cyclone_jobs
            DROP CONSTRAINT ck_cyclone_jobs_lost,
            DROP COLUMN lost,
            DROP COLUMN lease
        """
    )
