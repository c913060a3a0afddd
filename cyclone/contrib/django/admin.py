"""Read-only admin pages for runs and jobs, with actions that retry and cancel.

Columns and labels use the words of the Python API (docs/glossary.md): *started* and
*finished* for the columns ``attempted_at`` and ``finalized_at``.

Nothing here writes to cyclone's tables through the ORM: the pages only read, and the
actions call the run handles' ``retry()`` and ``cancel()``, ``Client.cancel_job()``,
``Client.retry_job()``, ``Client.pause_queue()`` and ``Client.resume_queue()``, which keep
cyclone's rules (a running run cannot be retried, a finished one cannot be cancelled, a
step is cancelled and retried with its run).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import display_for_field
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from cyclone.client import Client, StepStatus
from cyclone.contrib.django._discovery import definitions
from cyclone.contrib.django._engines import engine
from cyclone.contrib.django._job_page import job_args, job_errors, job_output
from cyclone.contrib.django._run_page import RunPage
from cyclone.contrib.django.models import Job, Queue, Run
from cyclone.errors import CycloneError
from cyclone.runs import Run as RunHandle
from cyclone.states import Parked


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewing only: no add, change or delete, whatever the user's permissions."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _shown(row: Run | Job, column: str) -> str:
    """A column's value as the admin shows that field (dates in the site's format)."""
    field = row._meta.get_field(column)
    return str(display_for_field(getattr(row, column), field, admin.site.empty_value_display))


@admin.display(description="started", ordering="attempted_at")
def started_at(job: Job) -> str:
    """When the job's last attempt started (``StepStatus.started_at``)."""
    return _shown(job, "attempted_at")


@admin.display(description="finished", ordering="finalized_at")
def finished_at(row: Run | Job) -> str:
    """When the run or job reached a terminal state (``RunStatus.finished_at``)."""
    return _shown(row, "finalized_at")


_WHEN = models.DateTimeField()
"""How the admin shows a time that is no column of the row (the site's format)."""


def _client(row: Run | Job) -> Client:
    return Client(engine(row._state.db or "default"))


def _at(value: Any) -> str:
    return str(display_for_field(value, _WHEN, admin.site.empty_value_display))


def _waits(step: StepStatus) -> str:
    """What a step waits for, as the CLI and the dashboard say it; empty if it does not."""
    if step.waiting_for is not None:
        timeout = f" (times out at {_at(step.wakes_at)})" if step.wakes_at else ""
        return f"waiting for {step.waiting_for!r}{timeout}"
    if step.wakes_at is None:
        return ""
    if step.parked == Parked.SLEEPING:
        return f"sleeping until {_at(step.wakes_at)}"
    if step.parked == Parked.DELAYED:
        return f"starts at {_at(step.wakes_at)}"
    return f"{'retries' if step.errors else 'due'} at {_at(step.wakes_at)}"


@admin.display(description="parked")
def parked(run: Run) -> str:
    """Why a running run waits with no step running or due (``RunStatus.parked``)."""
    if run.state != "running":
        return ""
    status = _client(run).get_run(run.id)
    return "" if status is None or status.parked is None else status.parked.value


@admin.display(description="waits")
def run_waits(run: Run) -> str:
    """What a parked run waits for: its signals, or when it wakes or starts."""
    detail = (
        _client(run).get_run_detail(run.id, children_limit=0) if run.state == "running" else None
    )
    if detail is None or detail.status.parked is None:
        return str(admin.site.empty_value_display)
    kind = detail.status.parked
    return "; ".join(_waits(s) for s in detail.steps if s.parked == kind)


@admin.display(description="waits")
def step_waits(job: Job) -> str:
    """What a step of a running run waits for: its signal, or when it wakes (``StepStatus``)."""
    if job.state not in ("blocked", "available") or job.run_id is None:
        return ""
    detail = _client(job).get_run_detail(job.run_id, children_limit=0)
    found = [] if detail is None else [s for s in detail.steps if s.job_id == job.id]
    return _waits(found[0]) if found else ""


class ParkedFilter(admin.SimpleListFilter):
    """Running runs parked so (``Client.list_runs(parked=...)``): their newest
    :data:`PARKED_SHOWN`, found through cyclone's indexes."""

    title = "parked"
    parameter_name = "parked"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(kind.value, kind.value) for kind in Parked]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        client = Client(engine(queryset.db))
        found = client.list_runs(parked=Parked(value), limit=PARKED_SHOWN)
        return queryset.filter(id__in=[run.id for run in found])


PARKED_SHOWN = 10_000
"""The parked runs the admin's filter lists, at most (the newest)."""


JOB_FIELDS = (
    "id",
    "run",
    "workflow",
    "kind",
    "queue",
    "priority",
    "state",
    job_args,
    job_output,
    "attempt",
    "max_attempts",
    job_errors,
    "unique_key",
    "worker_id",
    "scheduled_at",
    "created_at",
    started_at,
    "heartbeat_at",
    finished_at,
)
"""A job's page: every column, ``attempted_at`` and ``finalized_at`` under their public words,
the JSON columns ``args``, ``output`` and ``errors`` drawn readably (:mod:`._job_page`)."""


class WorkflowFilter(admin.SimpleListFilter):
    """Filter by the project's workflows, without scanning the table for its distinct names."""

    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        workflows, _ = definitions()
        return sorted((wf.name, wf.name) for wf in workflows)

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return queryset.filter(workflow=value) if value else queryset


class StepInline(admin.TabularInline):
    """A run's steps on its page: state, attempts and the errors of each attempt."""

    model = Job
    fk_name = "run"
    verbose_name = "step"
    verbose_name_plural = "steps"
    fields = (  # each attempt's error and traceback: in the run's drawing above
        "kind",
        "state",
        step_waits,
        "attempt",
        "max_attempts",
        started_at,
        finished_at,
    )
    readonly_fields = fields
    ordering = ("id",)
    extra = 0
    can_delete = False
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # A map node's items are jobs of the run under the node's name, not steps: the
        # node's own row stands for them (docs/map.md), as on the dashboard's run page.
        return super().get_queryset(request).filter(item__isnull=True)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _operate(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    rows: QuerySet[Any],
    verb: str,
    call: Callable[[Any], object],
) -> None:
    """Call ``call`` on each selected row; report what was done and each refusal."""
    done = 0
    for row in rows:
        try:
            call(row)
        except CycloneError as exc:
            modeladmin.message_user(request, f"{row}: {exc}", messages.ERROR)
        else:
            done += 1
    if done:
        noun = rows.model._meta.verbose_name
        plural = rows.model._meta.verbose_name_plural
        modeladmin.message_user(
            request, f"{verb} {done} {noun if done == 1 else plural}.", messages.SUCCESS
        )


def _handle(queryset: QuerySet[Run]) -> Callable[[Run], RunHandle]:
    bind = engine(queryset.db)
    return lambda run: RunHandle(bind, run.id, run.workflow, run.submit_key)


@admin.register(Run)
class RunAdmin(RunPage, ReadOnlyAdmin):
    """Runs newest first, filtered by state and workflow; a run's page lists its steps."""

    list_display = ("id", "workflow", "submit_key", "state", parked, "created_at", finished_at)
    list_filter = ("state", ParkedFilter, WorkflowFilter)
    fields = (*RunPage.fields, run_waits)
    readonly_fields = (run_waits,)
    search_fields = ("=submit_key",)
    show_full_result_count = False
    inlines = (StepInline,)
    actions = ("retry_runs", "cancel_runs")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.operate_run"))

    @admin.action(description="Retry the failed and cancelled steps", permissions=("operate",))
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        handle = _handle(queryset)
        _operate(self, request, queryset, "Retried", lambda run: handle(run).retry())

    @admin.action(description="Cancel the selected runs", permissions=("operate",))
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        handle = _handle(queryset)
        _operate(self, request, queryset, "Cancelled", lambda run: handle(run).cancel())


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs newest first: the steps of runs and standalone jobs; search by exact kind or key."""

    list_display = (
        "id",
        "kind",
        "workflow",
        "run",
        "state",
        "attempt",
        "created_at",
        finished_at,
    )
    change_form_template = "cyclone/admin/job_change_form.html"
    fields = JOB_FIELDS
    readonly_fields = JOB_FIELDS
    list_filter = ("state", WorkflowFilter)
    search_fields = ("=kind", "=unique_key")
    show_full_result_count = False
    list_select_related = ("run",)
    actions = ("cancel_jobs", "retry_jobs")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.operate_job"))

    @admin.action(description="Cancel the selected standalone jobs", permissions=("operate",))
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        for step in queryset.filter(run__isnull=False):
            self.message_user(
                request, f"{step} is a step of run {step.run_id}: cancel the run", messages.ERROR
            )
        client = Client(engine(queryset.db))
        standalone = queryset.filter(run__isnull=True)
        _operate(self, request, standalone, "Cancelled", lambda job: client.cancel_job(job.id))

    @admin.action(
        description="Retry the selected failed or cancelled standalone jobs",
        permissions=("operate",),
    )
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        for step in queryset.filter(run__isnull=False):
            self.message_user(
                request, f"{step} is a step of run {step.run_id}: retry the run", messages.ERROR
            )
        client = Client(engine(queryset.db))
        standalone = queryset.filter(run__isnull=True)
        _operate(self, request, standalone, "Retried", lambda job: client.retry_job(job.id))


@admin.register(Queue)
class QueueAdmin(ReadOnlyAdmin):
    """The queues ever paused, paused or not; actions pause and resume them.

    A queue that was never paused has no row here: pause it first with
    ``cyclone queues pause NAME``, ``Client.pause_queue`` or the dashboard.
    """

    list_display = ("name", "paused", "paused_at", "updated_at")
    list_filter = ("paused",)
    actions = ("pause_queues", "resume_queues")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.operate_queue"))

    @admin.action(description="Pause the selected queues", permissions=("operate",))
    def pause_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        client = Client(engine(queryset.db))
        _operate(self, request, queryset, "Paused", lambda queue: client.pause_queue(queue.name))

    @admin.action(description="Resume the selected queues", permissions=("operate",))
    def resume_queues(self, request: HttpRequest, queryset: QuerySet[Queue]) -> None:
        client = Client(engine(queryset.db))
        _operate(self, request, queryset, "Resumed", lambda queue: client.resume_queue(queue.name))
