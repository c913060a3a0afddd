"""``cyclone_ring()`` remembers only that it rang.

Revision ID: cyclone_0030_ring_memo
Revises: cyclone_0029_limit_key_distinct
Create Date: 2026-12-07

``cyclone_ring()`` (revision cyclone_0019_waiters) kept its answer for the rest of the
transaction in the local setting ``cyclone.rang``, ``'y'`` or ``'n'``. Writing that
setting was about a third of a call's cost, and a busy system (no worker asleep) paid it
in every transaction that made work, where the answer is ``'n'``. Now only a ring is
remembered: a transaction that read no waiter reads them again at its next call (its
slot's lock is already held, so that costs a read of a small table), which may ring
where the answer before would not have, never the reverse. A statement whose row
trigger rings for many rows (a retry of many jobs) reads the waiters once per row while
no worker sleeps. Code from before this revision calls the function the same way.
"""

from alembic import op

revision = "cyclone_0030_ring_memo"
down_revision = "cyclone_0029_limit_key_distinct"
branch_labels = None
depends_on = None

RING = """
CREATE OR REPLACE FUNCTION cyclone_ring() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('cyclone.rang', true) = 'y' THEN
        RETURN true;
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pg_advisory_xact_lock_shared(1668899692, pg_backend_pid() % 64);
        IF NOT EXISTS (SELECT FROM cyclone_waiters WHERE waits_until > now()) THEN
            RETURN false;
        END IF;
    END IF;
    PERFORM pg_notify('cyclone_jobs_available', '');
    PERFORM set_config('cyclone.rang', 'y', true);
    RETURN true;
END $$
"""

RING_BEFORE = """
CREATE OR REPLACE FUNCTION cyclone_ring() RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    decided text := current_setting('cyclone.rang', true);
BEGIN
    IF decided IN ('y', 'n') THEN
        RETURN decided = 'y';
    END IF;
    IF current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pg_advisory_xact_lock_shared(1668899692, pg_backend_pid() % 64);
        IF NOT EXISTS (SELECT FROM cyclone_waiters WHERE waits_until > now()) THEN
            PERFORM set_config('cyclone.rang', 'n', true);
            RETURN false;
        END IF;
    END IF;
    PERFORM pg_notify('cyclone_jobs_available', '');
    PERFORM set_config('cyclone.rang', 'y', true);
    RETURN true;
END $$
"""


def upgrade() -> None:
    op.execute(RING)


def downgrade() -> None:
    op.execute(RING_BEFORE)
