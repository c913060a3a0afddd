"""New available jobs ring NOTIFY from the statements that insert them, not from a trigger.

Revision ID: cyclone_0004
Revises: cyclone_0003
Create Date: 2026-12-03

The row trigger ``cyclone_jobs_inserted`` (``AFTER INSERT ... WHEN (NEW.state =
'available')``, see cyclone_0002) cost about 70 us per submitted run: an after-trigger
event, then a PL/pgSQL call, for one ``pg_notify``. cyclone's two insert statements (a
run's steps, a standalone job) now call ``pg_notify('cyclone_jobs_available', '')`` in
their ``RETURNING`` for each available job they insert, in the same transaction, so the
notification is delivered on commit as before. State changes by ``UPDATE`` (a step
unblocked, a retry, a rescue) still notify through ``cyclone_jobs_state_changed``.

Deploy the code that carries the statements before this revision: code from before it,
run against this schema, inserts jobs without notifying, and idle workers then find
them only at their next poll (``poll_interval``, 5 s by default).
"""

from alembic import op

revision = "cyclone_0004"
down_revision = "cyclone_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DROP TRIGGER cyclone_jobs_inserted ON cyclone_jobs")


def downgrade() -> None:
    op.execute(
        """
        CREATE TRIGGER cyclone_jobs_inserted AFTER INSERT ON cyclone_jobs
        FOR EACH ROW WHEN (NEW.state = 'available')
        EXECUTE FUNCTION cyclone_notify_job_changed()
        """
    )
