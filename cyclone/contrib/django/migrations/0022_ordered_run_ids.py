"""cyclone's revision ``cyclone_0027_ordered_run_ids``: new runs get time-ordered
ids (``cyclone_uuid7()``), so their index entries land together.

The schema moves on to the new head; no model changes (the id's default is the
database's).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0027_ordered_run_ids"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0021_worker_rescue_after")]

    operations = [apply_revisions(down_to="cyclone_0026_worker_rescue_after")]
