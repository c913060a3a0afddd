"""cyclone's revision ``cyclone_0018_step_limits``: flow control on workflow steps.

The schema moves on to the new head; no model changes (limits have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0018_step_limits"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0012_map_items")]

    operations = [apply_revisions(down_to="cyclone_0017_map_items")]
