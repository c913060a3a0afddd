"""cyclone for Django: add ``"cyclone.contrib.django"`` to ``INSTALLED_APPS``.

The app lets the ``_tx`` calls take Django's connection (``django.db.connection`` or
``connections[alias]``) and join its transaction, creates cyclone's schema through
``manage.py migrate``, adds ``manage.py cyclone ...`` (worker, migrate, runs, ...) and
read-only admin pages for runs and jobs. Settings:

- ``CYCLONE_DATABASE``: the ``DATABASES`` alias the worker and the commands use
  (default ``"default"``);
- ``CYCLONE_WORKFLOW_MODULES``: modules defining the workflows and step kinds (default:
  the ``workflows`` module of every installed app);
- ``CYCLONE_ENGINE_OPTIONS``: keyword arguments for the Engines' ``create_engine`` (pool size).
"""

from __future__ import annotations

from typing import Any

from cyclone.errors import MissingExtraError
from cyclone.worker import Worker

# Every module of this package imports this one first: Django missing is named here.
with MissingExtraError.guard(__name__, "django"):
    from cyclone.contrib.django._discovery import definitions
    from cyclone.contrib.django._engines import close_engines, engine
    from cyclone.contrib.django._steps import step_context

__all__ = ["close_engines", "definitions", "engine", "step_context", "worker"]


def worker(**options: Any) -> Worker:
    """A Worker for ``settings.CYCLONE_DATABASE`` running the project's definitions.

    Keyword arguments go to :class:`cyclone.Worker` (``concurrency=``, ``queues=``, ...).
    """
    workflows, steps = definitions()
    options.setdefault("step_context", step_context)
    return Worker(engine(), workflows=workflows, steps=steps, **options)
