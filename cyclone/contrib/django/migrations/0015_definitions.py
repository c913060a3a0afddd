"""cyclone's revision ``cyclone_0020_definitions``: a run names its workflow's definition.

The schema moves on to the new head; the unmanaged ``Run`` model's ``graph`` becomes
``definition`` (the id of a row of ``cyclone_definitions``, which holds the graph).
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0020_definitions"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0014_waiters")]

    operations = [
        apply_revisions(down_to="cyclone_0019_waiters"),
        migrations.RemoveField(model_name="run", name="graph"),
        migrations.AddField(
            model_name="run",
            name="definition",
            field=models.UUIDField(
                help_text="The version of the workflow's graph the run was submitted with "
                "(a row of cyclone_definitions).",
            ),
        ),
    ]
