"""Children of map items: a child run records the item of its parent's node (``@wf.child(over=)``).

Revision ID: cyclone_0021_child_items
Revises: cyclone_0020_definitions
Create Date: 2026-12-05

``cyclone_runs.parent_item`` is the index of the item of the parent's map of children
that submitted this run (NULL for the child of a plain child node, and for every other
run): with ``parent_id`` and ``parent_node`` it names the one job that waits for the run.
A nullable column without a default rewrites no rows.
"""

import sqlalchemy as sa

from alembic import op

revision = "cyclone_0021_child_items"
down_revision = "cyclone_0020_definitions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("cyclone_runs", sa.Column("parent_item", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("cyclone_runs", "parent_item")
