"""cyclone's revision ``cyclone_0030_run_jobs_index``: a run's steps have no unique
index of their own.

The schema moves on to the new head; no model changes (indexes have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0030_run_jobs_index"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0024_limit_key_distinct")]

    operations = [apply_revisions(down_to="cyclone_0029_limit_key_distinct")]
