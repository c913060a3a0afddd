"""The trace context current at submit or enqueue, stored with the run or standalone job.

Revision ID: cyclone_0007
Revises: cyclone_0006
Create Date: 2026-12-03

``trace_context`` holds a W3C ``traceparent`` when ``cyclone.contrib.otel`` is instrumented
(else NULL), so the spans of a run's steps join the trace of the request that submitted
it. A nullable column without a default: adding it rewrites no rows.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0007"
down_revision = "cyclone_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cyclone_runs", sa.Column("trace_context", sa.Text()))
    op.add_column("cyclone_jobs", sa.Column("trace_context", sa.Text()))


def downgrade() -> None:
    op.drop_column("cyclone_jobs", "trace_context")
    op.drop_column("cyclone_runs", "trace_context")
