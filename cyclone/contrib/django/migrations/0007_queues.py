"""cyclone's revision ``cyclone_0012``: paused queues, ``cyclone_queues``.

The schema moves on to the new head; the unmanaged ``Queue`` model reads the new table.
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0012"  # cyclone's head revision when this migration was written

    dependencies = [("cyclone", "0006_signals_waiting_index")]

    operations = [
        apply_revisions(down_to="cyclone_0011"),
        migrations.AlterModelOptions(
            name="job",
            options={
                "default_permissions": ("view",),
                "managed": False,
                "ordering": ("-created_at", "-id"),
                "permissions": (("operate_job", "Can cancel and retry standalone jobs"),),
            },
        ),
        migrations.CreateModel(
            name="Queue",
            fields=[
                ("name", models.TextField(primary_key=True, serialize=False)),
                ("paused", models.BooleanField()),
                ("paused_at", models.DateTimeField(null=True, verbose_name="paused since")),
                ("updated_at", models.DateTimeField(verbose_name="updated")),
            ],
            options={
                "db_table": "cyclone_queues",
                "ordering": ("name",),
                "managed": False,
                "default_permissions": ("view",),
                "permissions": (("operate_queue", "Can pause and resume queues"),),
            },
        ),
    ]
