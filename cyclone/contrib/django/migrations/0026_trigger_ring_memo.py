"""cyclone's revision ``cyclone_0031_trigger_ring_memo``: a row trigger that rings reads
the waiters once per statement.

The schema moves on to the new head; no model changes (functions have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0031_trigger_ring_memo"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0025_ring_memo")]

    operations = [apply_revisions(down_to="cyclone_0030_ring_memo")]
