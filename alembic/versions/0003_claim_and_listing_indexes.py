"""Claim indexes per served workflow and kind; a listing predicate PostgreSQL 17 keeps.

Revision ID: cyclone_0003
Revises: cyclone_0002
Create Date: 2026-12-03

The claim index was ``(priority, scheduled_at, id) WHERE state = 'available'``: a
worker read, in that order, every available job ahead of its own, including those of
workflows and kinds it does not serve. Two partial indexes replace it, one led by the
workflow (steps of runs) and one by the kind (standalone jobs); each served workflow or
kind is one range, and a worker serving several merges them.

The listing index ``(workflow, created_at, id)`` was partial on ``created_at IS NOT
NULL`` (see cyclone_0002). PostgreSQL 17 drops that qual from queries, the column being
NOT NULL, and then no longer matches the index to a listing. ``ix_cyclone_runs_listing``
replaces it, partial on ``created_at > '-infinity'``, as true for every run.

The new indexes are built inside the upgrade's transaction, which blocks writes to the
table while each builds (about a second per million rows here); the old ones are
dropped last, so the exclusive locks of the drops last only until the commit. On large
tables, build the new indexes beforehand without blocking, with the statements below
prefixed by ``CREATE INDEX CONCURRENTLY``; this revision then keeps them (by name: build
exactly these definitions), and refuses to go on if such a build failed and left one
invalid (drop it and build it again).
"""

from alembic import op

revision = "cyclone_0003"
down_revision = "cyclone_0002"
branch_labels = None
depends_on = None

NEW_INDEXES = {
    "ix_cyclone_jobs_claim_workflow": "cyclone_jobs (workflow, priority, scheduled_at, id) "
    "WHERE state = 'available' AND workflow IS NOT NULL",
    "ix_cyclone_jobs_claim_kind": "cyclone_jobs (kind, priority, scheduled_at, id) "
    "WHERE state = 'available' AND workflow IS NULL",
    "ix_cyclone_runs_listing": "cyclone_runs (workflow, created_at, id) "
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
    op.execute("DROP INDEX ix_cyclone_jobs_claim")
    op.execute("DROP INDEX ix_cyclone_runs_workflow_created_at_id")


def downgrade() -> None:
    op.execute(
        "CREATE INDEX ix_cyclone_jobs_claim ON cyclone_jobs (priority, scheduled_at, id) "
        "WHERE state = 'available'"
    )
    op.execute(
        "CREATE INDEX ix_cyclone_runs_workflow_created_at_id ON cyclone_runs "
        "(workflow, created_at, id) WHERE created_at IS NOT NULL"
    )
    for name in NEW_INDEXES:
        op.execute(f"DROP INDEX {name}")
