"""cyclone's schema (its alembic revisions, up to the newest), and the admin's unmanaged models.

The models are ``managed = False``: the tables come from the alembic revisions that
``apply_revisions`` runs. Reversing removes cyclone's schema.
"""

from __future__ import annotations

from django.db import migrations, models

from cyclone.contrib.django._migrate import apply_revisions


class Migration(migrations.Migration):
    initial = True
    atomic = False  # the revisions commit on a connection of their own
    revision = "cyclone_0004"  # cyclone's head revision when this migration was written

    dependencies: list[tuple[str, str]] = []

    operations = [
        apply_revisions(down_to="base"),
        migrations.CreateModel(
            name="Job",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("workflow", models.TextField(null=True)),
                ("kind", models.TextField()),
                ("queue", models.TextField()),
                ("priority", models.SmallIntegerField()),
                (
                    "state",
                    models.TextField(
                        choices=[
                            ("blocked", "blocked"),
                            ("available", "available"),
                            ("running", "running"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ]
                    ),
                ),
                ("args", models.JSONField(null=True)),
                ("output", models.JSONField(null=True)),
                ("attempt", models.IntegerField()),
                ("max_attempts", models.IntegerField()),
                ("errors", models.JSONField()),
                ("unique_key", models.TextField(null=True, verbose_name="unique key")),
                ("worker_id", models.TextField(null=True)),
                ("scheduled_at", models.DateTimeField(verbose_name="scheduled")),
                ("created_at", models.DateTimeField(verbose_name="created")),
                ("attempted_at", models.DateTimeField(null=True, verbose_name="attempted")),
                ("heartbeat_at", models.DateTimeField(null=True, verbose_name="heartbeat")),
                ("finalized_at", models.DateTimeField(null=True, verbose_name="finished")),
            ],
            options={
                "db_table": "cyclone_jobs",
                "ordering": ("-created_at", "-id"),
                "permissions": (("operate_job", "Can cancel standalone jobs"),),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
        migrations.CreateModel(
            name="Run",
            fields=[
                ("id", models.UUIDField(primary_key=True, serialize=False)),
                ("workflow", models.TextField()),
                ("submit_key", models.TextField(null=True, verbose_name="key")),
                ("input", models.JSONField()),
                ("graph", models.JSONField()),
                ("result_step", models.TextField(null=True)),
                (
                    "state",
                    models.TextField(
                        choices=[
                            ("running", "running"),
                            ("completed", "completed"),
                            ("failed", "failed"),
                            ("cancelled", "cancelled"),
                        ]
                    ),
                ),
                ("steps_remaining", models.IntegerField()),
                ("failed_step", models.TextField(null=True)),
                ("error", models.JSONField(null=True)),
                ("deadline", models.DateTimeField(null=True)),
                ("retention", models.DurationField(null=True)),
                ("created_at", models.DateTimeField(verbose_name="created")),
                ("finalized_at", models.DateTimeField(null=True, verbose_name="finished")),
            ],
            options={
                "db_table": "cyclone_runs",
                "ordering": ("-created_at", "-id"),
                "permissions": (("operate_run", "Can retry and cancel runs"),),
                "managed": False,
                "default_permissions": ("view",),
            },
        ),
    ]
