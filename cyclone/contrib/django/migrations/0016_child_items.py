"""cyclone's revision ``cyclone_0021_child_items``: a child run records its parent's item.

The schema moves on to the new head; the unmanaged ``Run`` model gains ``parent_item``.
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0021_child_items"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0015_definitions")]

    operations = [
        apply_revisions(down_to="cyclone_0020_definitions"),
        migrations.AddField(
            model_name="run",
            name="parent_item",
            field=models.IntegerField(
                "parent item",
                null=True,
                help_text="The item of the parent's map of children that submitted this run.",
            ),
        ),
    ]
