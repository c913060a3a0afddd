"""cyclone's revision ``cyclone_0025_workers``: the registry of running workers.

The schema moves on to the new head; no model changes (workers have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0025_workers"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0019_claim_statistics")]

    operations = [apply_revisions(down_to="cyclone_0024_claim_statistics")]
