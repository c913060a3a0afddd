"""cyclone's revision ``cyclone_0023_rated_jobs_index``: the pairs of a limit and the Rate
given with it that waiting jobs keep, indexed.

The schema moves on to the new head; no model changes (indexes have no model).
"""

from __future__ import annotations

from django.db import migrations

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0023_rated_jobs_index"  # cyclone's head revision when this was written

    dependencies = [("cyclone", "0017_kind_claim_index")]

    operations = [apply_revisions(down_to="cyclone_0022_kind_claim_index")]
