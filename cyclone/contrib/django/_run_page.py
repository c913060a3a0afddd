"""The Django admin's run page drawn as the dashboard draws it, not as raw JSON.

The run's graph, error and input are JSON columns; shown as admin fields they read as raw
JSON. The admin's run page shows the run's plain fields, then the sections of the
dashboard's own run page (the error, the DAG, each step's attempts and errors with their
tracebacks, the input and the result) rendered by the dashboard's templates, with a link to
the run in the dashboard when the project mounts it (``include(...dashboard)``). The drawing
needs the ``dashboard`` extra; without it the page says so and shows the fields.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from django.utils.safestring import mark_safe

from cyclone.contrib.django._engines import engine
from cyclone.errors import MissingExtraError

RUN_FIELDS: tuple[Any, ...] = (
    "id",
    "workflow",
    "submit_key",
    "state",
    "failed_step",
    "steps_remaining",
    "created_at",
    "finalized_at",
    "start_at",
    "deadline",
    "retention",
    "parent_id",
    "parent_node",
)
"""The run's own columns shown as fields; graph, error, input and result are drawn instead."""


class RunPage(admin.ModelAdmin):
    """The run admin's change page: :data:`RUN_FIELDS`, then the dashboard's drawing."""

    change_form_template = "cyclone/admin/run_change_form.html"
    fields = RUN_FIELDS

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        context = dict(extra_context or {})
        context.update(run_sections(object_id, self.get_queryset(request).db))
        return super().change_view(request, object_id, form_url, context)


def run_sections(object_id: str, alias: str) -> dict[str, Any]:
    """The template context of the run page's drawing (nothing for an id that is no run)."""
    try:
        run_id = uuid.UUID(object_id)
    except ValueError:
        return {}
    try:
        from cyclone.contrib.django.dashboard import dashboard_for
        from cyclone.dashboard import _embed
    except MissingExtraError as exc:
        return {"cyclone_missing": f"The run's graph, errors and tracebacks need {exc}"}
    html = dashboard_for(engine(alias)).render_run_sections(run_id)
    if html is None:
        return {}
    return {
        # Escaped by the dashboard's templates (autoescape), like every page it serves.
        "cyclone_run": mark_safe(html),
        "cyclone_stylesheet": mark_safe(_embed.scoped_stylesheet()),
        "cyclone_dashboard_url": dashboard_url(run_id),
    }


def dashboard_url(run_id: uuid.UUID) -> str | None:
    """The run's page in the project's dashboard, or None when the URLconf has none."""
    try:
        url: str = reverse("cyclone_dashboard:dashboard", kwargs={"subpath": f"runs/{run_id}"})
        return url
    except NoReverseMatch:
        return None
