"""cyclone's revision ``cyclone_0008``: a run's steps are created when it starts.

The schema moves on to the new head; the unmanaged ``Run`` model gains ``start_at``.
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0008"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0002_leases_schedules_signals_trace_context")]

    operations = [
        apply_revisions(down_to="cyclone_0007"),
        migrations.AddField(
            model_name="run",
            name="start_at",
            field=models.DateTimeField(
                "starts at",
                null=True,
                help_text="Set until a worker starts the run and creates its steps.",
            ),
        ),
    ]
