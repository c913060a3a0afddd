"""A row trigger that rings reads the waiters once per statement, not once per row.

Revision ID: cyclone_0031_trigger_ring_memo
Revises: cyclone_0030_ring_memo
Create Date: 2026-12-07

``cyclone_notify_job_changed()`` rings through ``cyclone_ring()`` for each job an update
makes available again (a retry, a rescue, a hand-back). Since revision
cyclone_0030_ring_memo a transaction that read no waiter reads them again at its next
call, so a statement making many jobs available read ``cyclone_waiters`` once per row
while no worker slept. The trigger now remembers that the ring found no waiter (the
local setting ``cyclone.quiet`` holds ``statement_timestamp()``), and rings no more while
that timestamp lasts: the rest of the statement's rows, and the later statements that
share it (those of one function call, or of one multi-statement query string). That is
safe because a "no" read under the ring slot's lock holds for the rest of the
transaction: the transaction holds the lock from before that read until it ends (or
until the savepoint it was taken in is rolled back, which undoes the setting too), so a
worker recorded as waiting after the read waits for it to end before its last claim
(see :mod:`cyclone._store.notify`). What it costs: a statement that makes one job
available while no worker waits writes the setting once, a few microseconds.
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
