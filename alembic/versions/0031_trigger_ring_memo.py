"""A row trigger that rings reads the waiters once per statement, not once per row.

Revision ID: cyclone_0031_trigger_ring_memo
Revises: cyclone_0030_ring_memo
Create Date: 2026-12-07

``cyclone_notify_job_changed()`` rings through ``cyclone_ring()`` for each job an update
makes available again (a retry, a rescue, a hand-back). Since revision
cyclone_0030_ring_memo a transaction that read no waiter reads them again at its next
call, so a statement making many jobs available read ``cyclone_waiters`` once per row
while no worker slept. The trigger now remembers, for the rest of its statement, that
the ring found no waiter (the local setting ``cyclone.quiet`` holds the statement's
``statement_timestamp()``), and rings no more for that statement's rows. That is safe:
the transaction holds its ring slot's lock from before that read until it ends, so a
worker recorded as waiting after the read waits for it to end before its last claim
(see :mod:`cyclone._store.notify`). A single-row statement pays nothing more: the
setting is written only after a ring that found no waiter.
"""

from alembic import op

revision = "cyclone_0031_trigger_ring_memo"
down_revision = "cyclone_0030_ring_memo"
branch_labels = None
depends_on = None

JOB_CHANGED = """
CREATE OR REPLACE FUNCTION cyclone_notify_job_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'available' THEN
        IF current_setting('cyclone.quiet', true) IS DISTINCT FROM statement_timestamp()::text THEN
            IF NOT cyclone_ring() THEN
                PERFORM set_config('cyclone.quiet', statement_timestamp()::text, true);
            END IF;
        END IF;
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
        PERFORM cyclone_ring();
    ELSE
        PERFORM pg_notify('cyclone_run_finished', 'job:' || NEW.id);
    END IF;
    RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.execute(JOB_CHANGED)


def downgrade() -> None:
    op.execute(JOB_CHANGED_BEFORE)
