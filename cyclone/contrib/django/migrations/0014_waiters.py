"""cyclone's revision ``cyclone_0019_waiters``: workers waiting for work, rung only then.

The schema moves on to the new head; no model changes (waiters have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0019_waiters"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0013_step_limits")]

    operations = [apply_revisions(down_to="cyclone_0018_step_limits")]
