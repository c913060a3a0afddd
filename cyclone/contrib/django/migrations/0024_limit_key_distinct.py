"""cyclone's revision ``cyclone_0029_limit_key_distinct``: the planner counts a limit's
keys as many (``n_distinct`` of ``limit_key``, 10,000).

The schema moves on to the new head; no model changes (statistics options have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0029_limit_key_distinct"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0023_heartbeat_index")]

    operations = [apply_revisions(down_to="cyclone_0028_heartbeat_index")]
