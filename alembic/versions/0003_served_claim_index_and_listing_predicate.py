"""Claim index led by what a worker serves; a listing predicate PostgreSQL 17 keeps.

Revision ID: cyclone_0003
Revises: cyclone_0002
Create Date: 2026-12-03

The claim index was ``(priority, scheduled_at, id) WHERE state = 'available'``: a
worker read, in that order, every available job ahead of its own, including those of
workflows and kinds it does not serve (25,000 of them cut a drain from ~3,800 to ~740
jobs/s). The new index leads with ``COALESCE(workflow, kind)``, the workflow of a run's
step or the kind of a standalone job; a claim reads each served key's range in order
and merges them.

The index is built inside the upgrade's transaction, which blocks writes to
``cyclone_jobs`` while it builds (about a second per million rows here). On a large
table, build it beforehand without blocking::

    CREATE INDEX CONCURRENTLY ix_cyclone_jobs_claim_served ON cyclone_jobs
        (COALESCE(workflow, kind), priority, scheduled_at, id) WHERE state = 'available';

and this revision keeps it (``IF NOT EXISTS``); drop it first if that build failed and
left it invalid.

The listing index ``(workflow, created_at, id)`` was partial on ``created_at IS NOT
NULL`` (see cyclone_0002). PostgreSQL 17 removes that qual from queries, the column being
NOT NULL, and then no longer matches the index to a listing. Its predicate is now
``created_at > '-infinity'``, as true for every run and kept by every version.
"""

from alembic import op

revision = "cyclone_0003"
down_revision = "cyclone_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX IF NOT EXISTS ix_cyclone_jobs_claim_served ON cyclone_jobs "
        "(COALESCE(workflow, kind), priority, scheduled_at, id) WHERE state = 'available'"
    )
    op.execute("DROP INDEX ix_cyclone_jobs_claim")
    _listing_index("created_at > '-infinity'::timestamp with time zone")


def _listing_index(predicate: str) -> None:
    op.execute("DROP INDEX ix_cyclone_runs_workflow_created_at_id")
    op.execute(
        "CREATE INDEX ix_cyclone_runs_workflow_created_at_id ON cyclone_runs "
        f"(workflow, created_at, id) WHERE {predicate}"
    )


def downgrade() -> None:
    _listing_index("created_at IS NOT NULL")
    op.execute(
        "CREATE INDEX ix_cyclone_jobs_claim ON cyclone_jobs (priority, scheduled_at, id) "
        "WHERE state = 'available'"
    )
    op.execute("DROP INDEX ix_cyclone_jobs_claim_served")
