"""A run's steps have no unique index of their own.

Revision ID: cyclone_0030_run_jobs_index
Revises: cyclone_0029_limit_key_distinct
Create Date: 2026-12-07

Every version of a step's job wrote an entry in two unique indexes on ``(run_id, kind)``:
``ix_cyclone_jobs_run_id_kind`` (partial on ``item IS NULL``, one job per step) and
``ix_cyclone_jobs_run_id_kind_item`` (every job). No update of a job is HOT (its state
is in other indexes' predicates), so a step's versions wrote every entry twice. The
first is dropped: the second finds a step by its run, its kind and ``item IS NULL``, and
a run's steps are inserted once, by the statement that starts the run under its row's
lock (or forks it, under a new id). A lookup of a run's steps by run alone now also
passes over the entries of its map items. Dropping the index takes an exclusive lock on
``cyclone_jobs`` until the upgrade commits (reads and writes wait; nothing is scanned
or rewritten); code of any version runs on either schema.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0030_run_jobs_index"
down_revision = "cyclone_0029_limit_key_distinct"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_cyclone_jobs_run_id_kind", table_name="cyclone_jobs")


def downgrade() -> None:
    op.create_index(
        "ix_cyclone_jobs_run_id_kind",
        "cyclone_jobs",
        ["run_id", "kind"],
        unique=True,
        postgresql_where=sa.text("item IS NULL"),
    )
