"""A run's jobs have one index, holding the jobs of runs only.

Revision ID: cyclone_0030_run_jobs_index
Revises: cyclone_0029_limit_key_distinct
Create Date: 2026-12-07

Every version of a step's job wrote an entry in two unique indexes on ``(run_id, kind)``:
``ix_cyclone_jobs_run_id_kind`` (partial on ``item IS NULL``, one job per step) and
``ix_cyclone_jobs_run_id_kind_item`` (every job). No job state lives outside the indexes'
predicates, so no update of a job is HOT, and a step's four versions wrote eight entries
in the pair. The first is dropped: the second answers every lookup it served (a B-tree
finds ``item IS NULL``), and a run's steps are inserted once, by the statement that
starts the run under its row's lock (or forks it, under a new id). The second becomes
partial on ``run_id IS NOT NULL``: a standalone job has no run and no item, and no query
reaches it through this index, while every query of a run's jobs (the foreign key's
cascade included) names a run, which implies the predicate. The index is rebuilt
inside the upgrade's transaction, which blocks writes to ``cyclone_jobs`` while it builds
(one scan of the table); code of any version runs on either schema.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0030_run_jobs_index"
down_revision = "cyclone_0029_limit_key_distinct"
branch_labels = None
depends_on = None


def _run_jobs_index(predicate: str | None) -> None:
    op.drop_index("ix_cyclone_jobs_run_id_kind_item", table_name="cyclone_jobs")
    op.create_index(
        "ix_cyclone_jobs_run_id_kind_item",
        "cyclone_jobs",
        ["run_id", "kind", "item"],
        unique=True,
        postgresql_where=None if predicate is None else sa.text(predicate),
    )


def upgrade() -> None:
    op.drop_index("ix_cyclone_jobs_run_id_kind", table_name="cyclone_jobs")
    _run_jobs_index("run_id IS NOT NULL")


def downgrade() -> None:
    _run_jobs_index(None)
    op.create_index(
        "ix_cyclone_jobs_run_id_kind",
        "cyclone_jobs",
        ["run_id", "kind"],
        unique=True,
        postgresql_where=sa.text("item IS NULL"),
    )
