"""Unmanaged, read-only models over cyclone's tables, for the admin and for ORM queries.

cyclone's alembic revisions own these tables (``managed = False``: Django's migrations
never create, alter or flush them). Write to them only through cyclone's API.
"""

from __future__ import annotations

from django.db import models

from cyclone.states import JobState, RunState


class Run(models.Model):
    """A row of ``cyclone_runs``: one run of a workflow."""

    id = models.UUIDField(primary_key=True)
    workflow = models.TextField()
    submit_key = models.TextField("key", null=True)
    input = models.JSONField()
    definition = models.UUIDField(
        help_text="The version of the workflow's graph the run was submitted with "
        "(a row of cyclone_definitions).",
    )
    result_step = models.TextField(null=True)
    state = models.TextField(choices=[(state.value, state.value) for state in RunState])
    steps_remaining = models.IntegerField()
    failed_step = models.TextField(null=True)
    error = models.JSONField(null=True)
    deadline = models.DateTimeField(null=True)
    retention = models.DurationField(null=True)
    created_at = models.DateTimeField("created")
    finalized_at = models.DateTimeField("finished", null=True)
    start_at = models.DateTimeField(
        "starts at", null=True, help_text="Set until a worker starts the run and creates its steps."
    )
    forked_from = models.UUIDField(
        "forked from",
        null=True,
        help_text="The run this run was forked from (run.fork), which may be purged.",
    )
    parent_id = models.UUIDField(
        "parent", null=True, help_text="The run whose child node submitted this run (@wf.child)."
    )
    parent_node = models.TextField("parent node", null=True)
    parent_item = models.IntegerField(
        "parent item",
        null=True,
        help_text="The item of the parent's map of children that submitted this run.",
    )

    class Meta:
        managed = False
        db_table = "cyclone_runs"
        ordering = ("-created_at", "-id")
        default_permissions = ("view",)
        permissions = (("operate_run", "Can retry and cancel runs"),)

    def __str__(self) -> str:
        return f"{self.workflow} {self.submit_key or self.id}"


class Job(models.Model):
    """A row of ``cyclone_jobs``: one step of a run, or a standalone job."""

    id = models.BigIntegerField(primary_key=True)
    run = models.ForeignKey(
        Run,
        db_column="run_id",
        db_constraint=False,
        null=True,
        on_delete=models.DO_NOTHING,
        related_name="steps",
    )
    workflow = models.TextField(null=True)
    kind = models.TextField()
    queue = models.TextField()
    priority = models.SmallIntegerField()
    state = models.TextField(choices=[(state.value, state.value) for state in JobState])
    args = models.JSONField(null=True)
    output = models.JSONField(null=True)
    attempt = models.IntegerField()
    max_attempts = models.IntegerField()
    errors = models.JSONField()
    unique_key = models.TextField("unique key", null=True)
    worker_id = models.TextField(null=True)
    scheduled_at = models.DateTimeField("scheduled")
    created_at = models.DateTimeField("created")
    attempted_at = models.DateTimeField("attempted", null=True)
    heartbeat_at = models.DateTimeField("heartbeat", null=True)
    finalized_at = models.DateTimeField("finished", null=True)
    item = models.IntegerField(
        null=True,
        help_text="A map item's index in the list its map node maps over, else empty.",
    )

    class Meta:
        managed = False
        db_table = "cyclone_jobs"
        ordering = ("-created_at", "-id")
        default_permissions = ("view",)
        permissions = (("operate_job", "Can cancel and retry standalone jobs"),)

    def __str__(self) -> str:
        return f"{self.kind} #{self.id}"


class Queue(models.Model):
    """A row of ``cyclone_queues``: a queue an operator paused (or paused and resumed)."""

    name = models.TextField(primary_key=True)
    paused = models.BooleanField()
    paused_at = models.DateTimeField("paused since", null=True)
    updated_at = models.DateTimeField("updated")

    class Meta:
        managed = False
        db_table = "cyclone_queues"
        ordering = ("name",)
        default_permissions = ("view",)
        permissions = (("operate_queue", "Can pause and resume queues"),)

    def __str__(self) -> str:
        return str(self.name)
