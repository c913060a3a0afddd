"""New runs get time-ordered ids: ``cyclone_runs.id`` defaults to ``cyclone_uuid7()``.

Revision ID: cyclone_0027_ordered_run_ids
Revises: cyclone_0026_worker_rescue_after
Create Date: 2026-12-06

A run's id was a random UUID (``gen_random_uuid()``), so each new run wrote its entry
into a random leaf of the runs' primary key, and each of its steps into random leaves
of the jobs' ``(run_id, kind)`` indexes: on large tables every insert touched a page
the cache had lost, and the first touch of a page after a checkpoint wrote the whole
page to the WAL. ``cyclone_uuid7()`` returns a version 7 UUID (RFC 9562): the first 48
bits are the server's clock in milliseconds, the rest random, so new entries land at the
right edge of those indexes. The server makes them, so every writer (old code during a
rolling deploy, batches, children, forks) gets them alike, from one clock.

Only the column's default changes: the runs in the table keep their ids, nothing is
rewritten, and the brief lock is the one any ``ALTER TABLE`` takes. The downgrade puts
``gen_random_uuid()`` back and drops the function.
"""

from alembic import op

revision = "cyclone_0027_ordered_run_ids"
down_revision = "cyclone_0026_worker_rescue_after"
branch_labels = None
depends_on = None

UUID7 = """
CREATE OR REPLACE FUNCTION cyclone_uuid7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(
        set_bit(set_bit(
            overlay(uuid_send(gen_random_uuid())
                PLACING substring(int8send(
                    floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                FROM 1 FOR 6),
            52, 1), 53, 1),
        'hex')::uuid
$$
"""
"""The milliseconds since 1970 over the first six bytes of a random UUID, and the
version nibble set from 4 to 7 (bits 52 and 53). A SQL function of one expression, which
the planner inlines into each insert."""


def upgrade() -> None:
    op.execute(UUID7)
    op.execute("ALTER TABLE cyclone_runs ALTER COLUMN id SET DEFAULT cyclone_uuid7()")


def downgrade() -> None:
    op.execute("ALTER TABLE cyclone_runs ALTER COLUMN id SET DEFAULT gen_random_uuid()")
    op.execute("DROP FUNCTION IF EXISTS cyclone_uuid7()")
