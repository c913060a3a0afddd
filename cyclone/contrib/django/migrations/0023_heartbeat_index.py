"""cyclone's revision ``cyclone_0028_heartbeat_index``: the heartbeats' index is partial
on the heartbeat, not on the running state.

The schema moves on to the new head; no model changes (indexes have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0028_heartbeat_index"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0022_ordered_run_ids")]

    operations = [apply_revisions(down_to="cyclone_0027_ordered_run_ids")]
