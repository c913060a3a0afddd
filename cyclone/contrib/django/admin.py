"""Read-only admin pages for runs and jobs, with actions that retry and cancel runs.

Nothing here writes to cyclone's tables through the ORM: the pages only read, and the
actions call the run handles' ``retry()`` and ``cancel()``, which keep cyclone's rules
(a running run cannot be retried, a finished one cannot be cancelled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from cyclone.contrib.django._engines import engine
from cyclone.contrib.django.models import Job, Run
from cyclone.errors import CycloneError
from cyclone.runs import Run as RunHandle


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewing only: no add, change or delete, whatever the user's permissions."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class StepInline(admin.TabularInline):
    """A run's steps on its page: state, attempts and the errors of each attempt."""

    model = Job
    fk_name = "run"
    verbose_name = "step"
    verbose_name_plural = "steps"
    fields = (
        "kind",
        "state",
        "attempt",
        "max_attempts",
        "errors",
        "attempted_at",
        "finalized_at",
    )
    readonly_fields = fields
    ordering = ("id",)
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _operate(
    modeladmin: RunAdmin,
    request: HttpRequest,
    queryset: QuerySet[Run],
    verb: str,
    call: Callable[[RunHandle], None],
) -> None:
    bind = engine(queryset.db)
    done = 0
    for run in queryset:
        try:
            call(RunHandle(bind, run.id, run.workflow, run.submit_key))
        except CycloneError as exc:
            modeladmin.message_user(request, f"{run}: {exc}", messages.ERROR)
        else:
            done += 1
    if done:
        noun = "run" if done == 1 else "runs"
        modeladmin.message_user(request, f"{verb} {done} {noun}.", messages.SUCCESS)


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    """Runs newest first, filtered by state and workflow; a run's page lists its steps."""

    list_display = ("id", "workflow", "submit_key", "state", "created_at", "finalized_at")
    list_filter = ("state", "workflow")
    search_fields = ("=submit_key",)
    show_full_result_count = False
    inlines = (StepInline,)
    actions = ("retry_runs", "cancel_runs")

    def has_operate_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return bool(request.user.has_perm(f"{opts.app_label}.operate_run"))

    @admin.action(description="Retry the failed and cancelled steps", permissions=("operate",))
    def retry_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _operate(self, request, queryset, "Retried", RunHandle.retry)

    @admin.action(description="Cancel the selected runs", permissions=("operate",))
    def cancel_runs(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        _operate(self, request, queryset, "Cancelled", RunHandle.cancel)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    """Jobs newest first: the steps of runs and standalone jobs, filtered by state and kind."""

    list_display = (
        "id",
        "kind",
        "workflow",
        "run",
        "state",
        "attempt",
        "created_at",
        "finalized_at",
    )
    list_filter = ("state", "workflow", "kind", "queue")
    search_fields = ("=unique_key",)
    show_full_result_count = False
    list_select_related = ("run",)
