"""cyclone's revision ``cyclone_0026_worker_rescue_after``: each registered worker records
its ``rescue_after``, by which the maintenance leader judges it and its jobs.

The schema moves on to the new head; no model changes (workers have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0026_worker_rescue_after"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0020_workers")]

    operations = [apply_revisions(down_to="cyclone_0025_workers")]
