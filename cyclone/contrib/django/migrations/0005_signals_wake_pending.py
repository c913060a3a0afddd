"""cyclone's revision ``cyclone_0010``: signals sent to parked wait nodes, delivered by claims.

The schema moves on to the new head; no model changes (signals have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0010"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0004_leader_lease")]

    operations = [apply_revisions(down_to="cyclone_0009")]
