"""Listings and counts filtered by state read an index: a rare state costs its own runs.

Revision ID: cyclone_0012
Revises: cyclone_0010
Create Date: 2026-12-05

A listing of the runs in one state (``Client.list_runs(state=...)``, the dashboard's
state filter, ``cyclone runs list --state``) read the runs newest first and filtered
them, so a state few runs are in (the failed or running among a million completed)
read the whole table, or, on the dashboard, 10,000 runs a page. Two indexes answer
it, newest first, by keyset: ``(state, created_at, id)`` and, for a workflow's runs in
one state, ``(workflow, state, created_at, id)``; the second also bounds the overview's
counts per workflow and state (an index-only read per pair, up to a cap).

Like ``ix_cyclone_runs_listing`` (cyclone_0003), both are partial on ``created_at >
'-infinity'``, true for every run, which only a listing states: no other statement that
filters on ``state`` (the claim, deadlines, rescue) can be planned onto them.

A state change of a run now updates these two indexes (it already updated
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

revision = "cyclone_0012"
down_revision = "cyclone_0010"
branch_labels = None
depends_on = None

NEW_INDEXES = {
    "ix_cyclone_runs_listing_state": "cyclone_runs (state, created_at, id) "
    "WHERE created_at > '-infinity'::timestamp with time zone",
    "ix_cyclone_runs_listing_workflow_state": "cyclone_runs (workflow, state, created_at, id) "
    "WHERE created_at > '-infinity'::timestamp with time zone",
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


def downgrade() -> None:
    for name in reversed(NEW_INDEXES):
        op.execute(f"DROP INDEX {name}")
