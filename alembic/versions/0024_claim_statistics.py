"""Statistics of the jobs' states per workflow and kind, so a claim is planned on its backlog.

Revision ID: cyclone_0024_claim_statistics
Revises: cyclone_0023_rated_jobs_index
Create Date: 2026-12-06

A claim reads the available jobs of one workflow or kind in priority order through its
claim index, and stops after the few it takes. The planner estimated those jobs as the
product of each condition's share of the table (``state = 'available'`` times
``workflow = ...``), which on a table of many finished jobs is a handful where thousands
wait. Estimating a handful, it could as well read them through
``ix_cyclone_jobs_available`` and sort them, which reads (and probes the run of) every
waiting job of the workflow on every claim. ``cyclone_jobs_claim_keys`` keeps the most
common combinations of state, workflow, kind and limit, so the planner knows how many
jobs of a workflow or kind wait. Creating it does not block writes; the revision then
analyzes the table (a sample of its rows) so the claim uses it at once, unless the table
is empty: an empty table analyzed is planned as empty (sequential scans) until
autovacuum analyzes it again, where one never analyzed is planned on its real size.
"""

from alembic import op

revision = "cyclone_0024_claim_statistics"
down_revision = "cyclone_0023_rated_jobs_index"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE STATISTICS IF NOT EXISTS cyclone_jobs_claim_keys (mcv) "
        "ON state, workflow, kind, limit_name FROM cyclone_jobs"
    )
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT FROM cyclone_jobs) THEN ANALYZE cyclone_jobs; END IF; END $$"
    )


def downgrade() -> None:
    op.execute("DROP STATISTICS IF EXISTS cyclone_jobs_claim_keys")
