"""cyclone's revision ``cyclone_0024_claim_statistics``: statistics of the jobs' states per
workflow and kind, so a claim is planned on its backlog.

The schema moves on to the new head; no model changes (statistics have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0024_claim_statistics"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0018_rated_jobs_index")]

    operations = [apply_revisions(down_to="cyclone_0023_rated_jobs_index")]
