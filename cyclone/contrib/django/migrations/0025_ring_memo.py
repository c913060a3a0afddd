"""cyclone's revision ``cyclone_0030_ring_memo``: ``cyclone_ring()`` remembers only that
it rang.

The schema moves on to the new head; no model changes (functions have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0030_ring_memo"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0024_limit_key_distinct")]

    operations = [apply_revisions(down_to="cyclone_0029_limit_key_distinct")]
