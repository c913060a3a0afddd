"""One unique index for a run's steps and items, which standalone jobs stay out of.

Revision ID: cyclone_0029_run_steps_index
Revises: cyclone_0028_heartbeat_index
Create Date: 2026-12-06

A run has one job per step and one per item of a map node (``item`` their index, NULL
for a step's job). Two unique indexes said so: ``ix_cyclone_jobs_run_id_kind`` on
``(run_id, kind)`` where ``item IS NULL`` (a NULL is distinct from every other, so the
second could not), and ``ix_cyclone_jobs_run_id_kind_item`` on ``(run_id, kind, item)``,
not partial, which the foreign key's cascade and the reads of a run's jobs reach. A
step's job wrote an entry in both at each of its four row versions (waiting, available,
running, ended), and a standalone job, which has no run, in both at each of its three.

On PostgreSQL 15 and later, ``ix_cyclone_jobs_run_steps`` replaces them: unique on
``(run_id, kind, item)`` with NULLS NOT DISTINCT, which covers the step's NULL item, and
partial on ``run_id IS NOT NULL``, which every condition on ``run_id`` implies, the
cascade's among them. A step's job writes one entry per version, a standalone job none.
PostgreSQL 13 and 14 have no NULLS NOT DISTINCT: there the revision changes nothing.

The index is built inside the upgrade's transaction, which blocks writes to
``cyclone_jobs`` while it builds (one scan of the table). On a large table, build it
beforehand without blocking, with the statement below prefixed by ``CREATE UNIQUE INDEX
CONCURRENTLY``; this revision then keeps it (by name: build exactly this definition),
and refuses to go on if such a build failed and left it invalid (drop it and build it
again).
"""

from alembic import op

revision = "cyclone_0029_run_steps_index"
down_revision = "cyclone_0028_heartbeat_index"
branch_labels = None
depends_on = None

NAME = "ix_cyclone_jobs_run_steps"
DEFINITION = "cyclone_jobs (run_id, kind, item) NULLS NOT DISTINCT WHERE run_id IS NOT NULL"
INVALID = (
    f"index {NAME} exists but is invalid (a failed CREATE INDEX CONCURRENTLY?): "
    f"DROP INDEX {NAME}; then upgrade again"
)


def upgrade() -> None:
    # One DO block, decided by the server it runs on, so that `cyclone migrate --sql`
    # output holds the same choice (and the check of an index built beforehand).
    op.execute(
        f"""DO $$ BEGIN
    IF current_setting('server_version_num')::int >= 150000 THEN
        EXECUTE 'CREATE UNIQUE INDEX IF NOT EXISTS {NAME} ON {DEFINITION}';
        IF NOT (SELECT indisvalid FROM pg_index WHERE indexrelid = '{NAME}'::regclass) THEN
            RAISE EXCEPTION '{INVALID}';
        END IF;
        DROP INDEX IF EXISTS ix_cyclone_jobs_run_id_kind;
        DROP INDEX IF EXISTS ix_cyclone_jobs_run_id_kind_item;
    END IF;
END $$"""
    )


def downgrade() -> None:
    op.execute(
        f"""DO $$ BEGIN
    IF to_regclass('{NAME}') IS NOT NULL THEN
        CREATE UNIQUE INDEX ix_cyclone_jobs_run_id_kind ON cyclone_jobs (run_id, kind)
            WHERE item IS NULL;
        CREATE UNIQUE INDEX ix_cyclone_jobs_run_id_kind_item
            ON cyclone_jobs (run_id, kind, item);
        DROP INDEX {NAME};
    END IF;
END $$"""
    )
