"""Listings by state read an index; the dashboard's counts read indexes only.

Revision ID: cyclone_0013
Revises: cyclone_0012
Create Date: 2026-12-05

A listing of the runs in one state (``Client.list_runs(state=...)``, the dashboard's
state filter, ``cyclone runs list --state``) read the runs newest first and filtered
them, so a state few runs are in (the failed or running among a million completed)
read the whole table, or, on the dashboard, 10,000 runs a page. Two indexes answer
it, newest first, by keyset: ``(state, created_at, id)`` and, for a workflow's runs in
one state, ``(workflow, state, created_at, id)``; the second also bounds the overview's
counts per workflow and state (an index-only read per pair, up to a cap).

Two more let the overview's other counts read an index alone, not the rows: the chart
of runs ended per minute reads ``(finalized_at, state)`` (it replaces the index on
``finalized_at`` alone, which the sweeper's reads use as before), and the backlog's
available jobs per queue, workflow and kind read ``(queue, workflow, kind,
scheduled_at) WHERE state = 'available'`` (a job becoming available, when it is made,
unblocked or retried, writes one more index entry; a claim none).

Like ``ix_cyclone_runs_listing`` (cyclone_0003), the listing indexes are partial on ``created_at >
'-infinity'``, true for every run, which only a listing states: no other statement that
filters on ``state`` (the claim, deadlines, rescue) can be planned onto them.

A state change of a run now updates the listing indexes (it already updated
``ix_cyclone_runs_finalized_at``); updates that leave the state alone (a step's
completion counting ``steps_remaining`` down) are unaffected.

The indexes are built inside the upgrade's transaction, which blocks writes to
``cyclone_runs`` while each builds (about a second per million runs here). On a large
table, build them beforehand without blocking, with the statements below prefixed by
``CREATE INDEX CONCURRENTLY``; this revision then keeps them (by name: build exactly
these definitions), and refuses to go on if such a build failed and left one invalid
(drop it and build it again).
"""

from alembic import op

revision = "cyclone_0013"
down_revision = "cyclone_0012"
branch_labels = None
depends_on = None

NEW_INDEXES = {
    "ix_cyclone_runs_listing_state": "cyclone_runs (state, created_at, id) "
    "WHERE created_at > '-infinity'::timestamp with time zone",
    "ix_cyclone_runs_listing_workflow_state": "cyclone_runs (workflow, state, created_at, id) "
    "WHERE created_at > '-infinity'::timestamp with time zone",
    "ix_cyclone_runs_finalized_at_state": "cyclone_runs (finalized_at, state) "
    "WHERE finalized_at IS NOT NULL",
    "ix_cyclone_jobs_available": "cyclone_jobs (queue, workflow, kind, scheduled_at) "
    "WHERE state = 'available'",
}
REPLACED = {
    "ix_cyclone_runs_finalized_at": "cyclone_runs (finalized_at) WHERE finalized_at IS NOT NULL"
}


def upgrade() -> None:
    for name, definition in NEW_INDEXES.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}")
        # A DO block, so that `cyclone migrate --sql` output checks it too.
        message = (
            f"index {name} exists but is invalid (a failed CREATE INDEX CONCURRENTLY?): "
            f"DROP INDEX {name}; then upgrade again"
        )
        op.execute(
            f"DO $$ BEGIN IF NOT (SELECT indisvalid FROM pg_index "
            f"WHERE indexrelid = '{name}'::regclass) THEN RAISE EXCEPTION '{message}'; "
            f"END IF; END $$"
        )
    for name in REPLACED:
        op.execute(f"DROP INDEX {name}")


def downgrade() -> None:
    for name, definition in REPLACED.items():
        op.execute(f"CREATE INDEX {name} ON {definition}")
    for name in reversed(NEW_INDEXES):
        op.execute(f"DROP INDEX {name}")
