"""The Django admin's job page shows a job's arguments, output and errors readably.

``args``, ``output`` and ``errors`` are JSON columns; as admin fields they read as one line
of raw JSON. Here the arguments and the output are indented JSON in a ``<pre>``, and the
errors are each attempt's error as the dashboard's job page shows it: the attempt, the
exception's type and message, when, and its traceback in a ``<pre>``. Everything shown is
escaped (``format_html``). Needs no extra: the dashboard's templates are not used.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, cast

from django.contrib import admin
from django.contrib.admin.utils import display_for_field
from django.db import models
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from cyclone.contrib.django.models import Job

MAX_SHOWN = 100_000
"""Characters of a JSON value shown, at most (as on the dashboard's pages)."""

_WHEN = models.DateTimeField()


def pretty(value: Any) -> str:
    """A JSON value indented for reading, cut at :data:`MAX_SHOWN` characters."""
    shown = json.dumps(value, indent=2, ensure_ascii=False)
    if len(shown) > MAX_SHOWN:
        return f"{shown[:MAX_SHOWN]}\n… ({len(shown) - MAX_SHOWN:,} more characters not shown)"
    return shown


def _json(value: Any) -> str:
    if value is None:
        return str(admin.site.empty_value_display)
    shown = format_html('<pre class="cyclone-json">{}</pre>', pretty(value))
    return cast(str, shown)  # a SafeString: the admin shows it as HTML


@admin.display(description="args")
def job_args(job: Job) -> str:
    """A standalone job's arguments, indented (a step's are empty: it reads its run's input)."""
    return _json(job.args)


@admin.display(description="output")
def job_output(job: Job) -> str:
    """What the job returned, indented (nothing before it completed)."""
    return _json(job.output)


def _when(value: Any) -> str:
    """An error's ``at`` (ISO 8601) in the site's format; as stored if it is no time."""
    try:
        moment = datetime.fromisoformat(str(value))
    except ValueError:
        return str(value)
    return str(display_for_field(moment, _WHEN, admin.site.empty_value_display))


def _error(record: Any) -> SafeString:
    if not isinstance(record, dict):
        return format_html('<div class="cyclone-error">{}</div>', _json(record))
    attempt = record.get("attempt")
    at = record.get("at")
    traceback = record.get("traceback")
    return format_html(
        '<div class="cyclone-error"><p>{}<strong>{}</strong>: {}{}</p>{}</div>',
        f"attempt {attempt} · " if attempt is not None else "",
        record.get("type") or "error",
        record.get("message", ""),
        format_html(' <span class="quiet">at {}</span>', _when(at)) if at else "",
        format_html('<pre class="cyclone-traceback">{}</pre>', traceback) if traceback else "",
    )


@admin.display(description="errors")
def job_errors(job: Job) -> str:
    """Each attempt's error, oldest first: type, message, when, and its traceback."""
    errors = job.errors
    records = [errors] if isinstance(errors, dict) else list(errors or [])
    if not records:
        return str(admin.site.empty_value_display)
    shown = format_html_join("", "{}", ((_error(record),) for record in records))
    return cast(str, shown)  # a SafeString: the admin shows it as HTML
