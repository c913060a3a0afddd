"""cyclone's revision ``cyclone_0017_map_items``: the items of a map node are jobs (``@wf.map``).

The schema moves on to the new head; the unmanaged ``Job`` model gains ``item``.
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0017_map_items"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0011_child_runs")]

    operations = [
        apply_revisions(down_to="cyclone_0016_child_runs"),
        migrations.AddField(
            model_name="job",
            name="item",
            field=models.IntegerField(
                null=True,
                help_text="A map item's index in the list its map node maps over, else empty.",
            ),
        ),
    ]
