"""cyclone's revision ``cyclone_0016_child_runs``: a run records its parent run and node.

The schema moves on to the new head; the unmanaged ``Run`` model gains ``parent_id`` and
``parent_node``.
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0016_child_runs"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0010_flow_control")]

    operations = [
        apply_revisions(down_to="cyclone_0015"),
        migrations.AddField(
            model_name="run",
            name="parent_id",
            field=models.UUIDField(
                "parent",
                null=True,
                help_text="The run whose child node submitted this run (@wf.child).",
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="parent_node",
            field=models.TextField("parent node", null=True),
        ),
    ]
