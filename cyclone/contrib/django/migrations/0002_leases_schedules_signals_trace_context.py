"""cyclone's revisions after ``cyclone_0004``: job leases, schedules and signals, trace context.

The unmanaged models are unchanged; only the schema moves on to the new head.
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0007"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0001_initial")]

    operations = [apply_revisions(down_to="cyclone_0004")]
