"""The pairs of a limit and the Rate given with it that waiting jobs keep, indexed.

Revision ID: cyclone_0023_rated_jobs_index
Revises: cyclone_0022_kind_claim_index
Create Date: 2026-12-05

A job given a Concurrency and a Rate together keeps the Rate's name beside its limit's
(``rate_name``, cyclone_0018_step_limits). After a deploy that keeps the Concurrency and
drops or renames the Rate, a worker looks for the Rates its definitions no longer give
(before its first claim, then every minute), so that the jobs enqueued before keep theirs.
It read only the first waiting job of each limit: a newer job without the Rate, first in
the order of ``ix_cyclone_jobs_gated``, hid the Rate of every earlier job, and they all
started at once. No index held ``rate_name``, so finding every such Rate read every
waiting job of the limit. ``ix_cyclone_jobs_rated`` holds ``(limit_name, rate_name)`` of
the available jobs given a Rate, and the look steps through its distinct pairs, one probe
each, whatever the number of jobs.

A rated job becoming available writes one more index entry; no update that was HOT
stops being one (``state`` and ``limit_name`` are indexed already, and ``rate_name`` is
written with the job).

The index is built inside the upgrade's transaction, which blocks writes to
``cyclone_jobs`` while it builds (one scan of the table, about a second per million rows
here). On a large table, build it beforehand without blocking, with the statement below
prefixed by ``CREATE INDEX CONCURRENTLY``; this revision then keeps it (by name: build
exactly this definition), and refuses to go on if such a build failed and left it invalid
(drop it and build it again).
"""

from alembic import op

revision = "cyclone_0023_rated_jobs_index"
down_revision = "cyclone_0022_kind_claim_index"
branch_labels = None
depends_on = None

NEW_INDEXES = {
    "ix_cyclone_jobs_rated": "cyclone_jobs (limit_name, rate_name) "
    "WHERE state = 'available' AND rate_name IS NOT NULL",
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
