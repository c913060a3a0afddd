"""A run names its workflow's definition, stored once per version; two runs' indexes go.

Revision ID: cyclone_0020_definitions
Revises: cyclone_0019_waiters
Create Date: 2026-12-05

Every run kept a copy of its workflow's graph (``cyclone_runs.graph``, most of the row),
although a workflow has one graph per deploy. ``cyclone_definitions`` now holds each
version once, keyed by a hash of the workflow's name and graph, and a run names its
version in ``cyclone_runs.definition``. A process writes a version's row once, before its
first run of that version (:mod:`cyclone._store.definitions`).

The upgrade keeps runs in flight running: the graphs of the runs already in the table
move into ``cyclone_definitions``, one row per distinct workflow and graph (their ids are
the hash of the graph's ``jsonb`` text, which a process never computes, so they never
collide with the versions processes write), and every run names its own: the column
``graph`` becomes ``definition`` by one rewrite of the table (``ALTER COLUMN ... TYPE
uuid USING`` the hash), which leaves no dead row versions behind and rebuilds the
indexes, inside the upgrade's transaction, blocking the runs' reads and writes while it
runs. The downgrade copies each run's graph back.

Two indexes of the runs go, each an entry written by every run (and again by each update
that moves a run's row): ``(created_at, id)`` and ``(workflow, created_at, id)``. A
listing of every state now reads the state indexes, ``(state, created_at, id)`` and
``(workflow, state, created_at, id)``, one range per state merged newest first. A new run
writes five index entries where it wrote seven.
"""

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision = "cyclone_0020_definitions"
down_revision = "cyclone_0019_waiters"
branch_labels = None
depends_on = None

_HASH = (
    "encode(substring(sha256(convert_to(workflow || E'\\n' || graph::text, 'UTF8')) "
    "FROM 1 FOR 16), 'hex')::uuid"
)
"""The id of a run's graph already in the table (see the module's docstring)."""

DROPPED = {
    "ix_cyclone_runs_created_at_id": "cyclone_runs (created_at, id)",
    "ix_cyclone_runs_listing": "cyclone_runs (workflow, created_at, id) "
    "WHERE created_at > '-infinity'::timestamp with time zone",
}


def upgrade() -> None:
    op.create_table(
        "cyclone_definitions",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("workflow", sa.Text(), nullable=False),
        sa.Column("graph", postgresql.JSONB(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cyclone_definitions")),
    )
    for name in DROPPED:
        op.execute(f"DROP INDEX IF EXISTS {name}")
    op.execute(
        "INSERT INTO cyclone_definitions (id, workflow, graph) "
        "SELECT DISTINCT ON (h) h, workflow, graph FROM "
        f"(SELECT {_HASH} AS h, workflow, graph FROM cyclone_runs) AS versions"
    )
    # One rewrite of the table: each row gets its graph's id in place of the graph, and no
    # dead row versions are left behind (an UPDATE would double the table).
    op.execute(f"ALTER TABLE cyclone_runs ALTER COLUMN graph TYPE uuid USING {_HASH}")
    op.alter_column("cyclone_runs", "graph", new_column_name="definition")


def downgrade() -> None:
    for name, definition in DROPPED.items():
        op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}")
    op.add_column(
        "cyclone_runs",
        sa.Column("graph", postgresql.JSONB(), nullable=True),
    )
    op.execute(
        "UPDATE cyclone_runs r SET graph = d.graph FROM cyclone_definitions d "
        "WHERE d.id = r.definition"
    )
    op.alter_column("cyclone_runs", "graph", nullable=False)
    op.drop_column("cyclone_runs", "definition")
    op.drop_table("cyclone_definitions")
