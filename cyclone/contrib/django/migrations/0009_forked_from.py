"""cyclone's revision ``cyclone_0014``: a run records the run it was forked from.

The schema moves on to the new head; the unmanaged ``Run`` model gains ``forked_from``.
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0014"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0008_listing_state_indexes")]

    operations = [
        apply_revisions(down_to="cyclone_0013"),
        migrations.AddField(
            model_name="run",
            name="forked_from",
            field=models.UUIDField(
                "forked from",
                null=True,
                help_text="The run this run was forked from (run.fork), which may be purged.",
            ),
        ),
    ]
