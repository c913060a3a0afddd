"""Ring ``cyclone_jobs_available`` only when a worker waits for work (``cyclone_waiters``).

Revision ID: cyclone_0019_waiters
Revises: cyclone_0018_step_limits
Create Date: 2026-12-05

A worker about to sleep records itself in ``cyclone_waiters`` (for a minute, renewed
while it sleeps), then waits for the transactions that may have read no waiter before
its record could be seen (each holds a shared advisory lock on one of 64 slots,
``(1668899692, pid % 64)``, from its read until it ends), then claims once more before
it sleeps. ``cyclone_ring()`` takes that lock, reads the waiters in a snapshot taken
after it, and calls ``pg_notify`` only when one is recorded: so new work is either
rung or seen by the waiter's last claim. Its answer holds for the rest of the
transaction (the slot is held until its end), so it decides once per transaction (the
local setting ``cyclone.rang``). Under REPEATABLE READ or SERIALIZABLE, whose snapshot
may predate the waiter's record, it always rings. ``cyclone_notify_job_changed()`` (jobs
made available by an update) rings through it too, except for a step unblocked (blocked
to available): the one statement that unblocks steps, a worker's record-and-claim, rings
once in its ``RETURNING``, where the row trigger cost an event and a call per step.

Code from before this revision rings unconditionally, which is still correct.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0019_waiters"
down_revision = "cyclone_0018_step_limits"
branch_labels = None
depends_on = None

RING = """
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

JOB_CHANGED = """
CREATE OR REPLACE FUNCTION cyclone_notify_job_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'available' THEN
        PERFORM cyclone_ring();
    ELSE
        PERFORM pg_notify('cyclone_run_finished', 'job:' || NEW.id);
    END IF;
    RETURN NULL;
END $$
"""

JOB_CHANGED_BEFORE = """
CREATE OR REPLACE FUNCTION cyclone_notify_job_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'available' THEN
        PERFORM pg_notify('cyclone_jobs_available', '');
    ELSE
        PERFORM pg_notify('cyclone_run_finished', 'job:' || NEW.id);
    END IF;
    RETURN NULL;
END $$
"""


TRIGGER_BEFORE = """
CREATE TRIGGER cyclone_jobs_state_changed AFTER UPDATE OF state ON cyclone_jobs
FOR EACH ROW WHEN (
    OLD.state IS DISTINCT FROM NEW.state AND (
        NEW.state = 'available'
        OR (NEW.run_id IS NULL AND NEW.state IN ('completed', 'failed', 'cancelled'))
    )
)
EXECUTE FUNCTION cyclone_notify_job_changed()
"""

TRIGGER = """
CREATE TRIGGER cyclone_jobs_state_changed AFTER UPDATE OF state ON cyclone_jobs
FOR EACH ROW WHEN (
    OLD.state IS DISTINCT FROM NEW.state AND (
        (NEW.state = 'available' AND OLD.state <> 'blocked')
        OR (NEW.run_id IS NULL AND NEW.state IN ('completed', 'failed', 'cancelled'))
    )
)
EXECUTE FUNCTION cyclone_notify_job_changed()
"""


def upgrade() -> None:
    op.create_table(
        "cyclone_waiters",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("waits_until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_cyclone_waiters")),
    )
    op.execute(RING)
    op.execute(JOB_CHANGED)
    op.execute("DROP TRIGGER cyclone_jobs_state_changed ON cyclone_jobs")
    op.execute(TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER cyclone_jobs_state_changed ON cyclone_jobs")
    op.execute(TRIGGER_BEFORE)
    op.execute(JOB_CHANGED_BEFORE)
    op.execute("DROP FUNCTION cyclone_ring()")
    op.drop_table("cyclone_waiters")
