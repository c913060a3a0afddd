"""A run's steps are created when it starts, not when it is submitted.

Revision ID: cyclone_0008
Revises: cyclone_0007
Create Date: 2026-12-03

``cyclone_runs.start_at`` holds when a submitted run may start while its steps do not
exist yet; the claim that starts it creates them and sets it to NULL. A submit then
writes one row. The partial index is what a claim reads to find the runs to start. Runs
already in the table have their steps: the column is NULL for them, and adding a
nullable column without a default rewrites no rows.

The downgrade creates the steps of the runs not yet started, as a submit before this
revision did, so that no run is lost.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0008"
down_revision = "cyclone_0007"
branch_labels = None
depends_on = None

_CREATE_PENDING_STEPS = """
INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, priority, state, deps, pending_deps,
                          max_attempts, deadline, scheduled_at, created_at, args)
SELECT r.id, r.workflow, s.name, s.queue, s.priority,
       CASE WHEN cardinality(s.after) = 0 THEN 'available' ELSE 'blocked' END,
       s.after, cardinality(s.after), s.max_attempts, r.deadline, r.start_at, r.created_at,
       CASE WHEN s.signal IS NULL THEN NULL ELSE jsonb_build_object('signal', s.signal) END
FROM cyclone_runs r
CROSS JOIN LATERAL jsonb_array_elements(r.graph -> 'steps') WITH ORDINALITY AS e(step, ord)
CROSS JOIN LATERAL jsonb_to_record(e.step)
    AS s(name text, after text[], max_attempts integer, queue text, priority smallint,
         signal text)
WHERE r.start_at IS NOT NULL
ORDER BY r.id, e.ord
"""


def upgrade() -> None:
    op.add_column("cyclone_runs", sa.Column("start_at", sa.DateTime(timezone=True)))
    op.create_index(
        "ix_cyclone_runs_start",
        "cyclone_runs",
        ["workflow", "start_at", "id"],
        postgresql_where=sa.text("start_at IS NOT NULL AND state = 'running'"),
    )


def downgrade() -> None:
    op.execute(_CREATE_PENDING_STEPS)
    op.drop_index("ix_cyclone_runs_start", table_name="cyclone_runs")
    op.drop_column("cyclone_runs", "start_at")
