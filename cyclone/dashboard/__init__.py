"""cyclone's web dashboard: a server-rendered WSGI application (extra ``cyclone[dashboard]``).

It shows runs, their DAGs, standalone jobs and backlogs, and, when the application allows
it, retries and cancels them. It runs standalone (:func:`serve`, ``cyclone dashboard``),
behind any WSGI mount (Flask's ``DispatcherMiddleware``, :mod:`cyclone.dashboard.flask`)
and in Django (``include("cyclone.contrib.django.dashboard")``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine

from cyclone.dashboard._app import Dashboard

__all__ = ["Dashboard", "create_app", "serve"]


def create_app(
    engine: Engine,
    *,
    authorize: Callable[[Mapping[str, Any]], bool] | None = None,
    title: str = "cyclone",
    secret: bytes | str | None = None,
) -> Dashboard:
    """Build the dashboard's WSGI application for the cyclone schema behind ``engine``.

    Args:
        engine: the Engine of the database cyclone's tables live in.
        authorize: called with the WSGI environ of each request; the actions (retry,
            retry all, cancel, pause and resume of a schedule) are shown and accepted
            only when it returns True. Without it the dashboard is read-only: no
            buttons, and every POST gets 403.
        title: the name in the page header and the browser tab.
        secret: the key that signs the CSRF tokens of the action forms. Pass the same
            value to every process serving the dashboard; by default each application
            makes its own at random.

    Returns:
        A WSGI application; mount it anywhere (it honours ``SCRIPT_NAME``).
    """
    return Dashboard(engine, authorize=authorize, title=title, secret=secret)


def serve(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8421,
    authorize: Callable[[Mapping[str, Any]], bool] | None = None,
) -> None:
    """Serve the dashboard over HTTP until interrupted (werkzeug's threaded server).

    This is what ``cyclone dashboard`` runs. It is meant for operators on a private
    network; put it behind a reverse proxy with authentication to expose it further.
    """
    from werkzeug.serving import run_simple

    app = create_app(engine, authorize=authorize)
    run_simple(host, port, app, threaded=True, use_reloader=False, use_debugger=False)
