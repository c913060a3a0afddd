"""Mount the dashboard inside a Flask application, under a URL prefix.

``mount(app, engine)`` wraps ``app.wsgi_app`` in werkzeug's ``DispatcherMiddleware``,
so requests under the prefix go to the dashboard and everything else to Flask. It is
the same as writing the middleware by hand, with the CSRF secret taken from the app.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from cyclone.dashboard import Dashboard, create_app


def mount(
    app: Any,
    engine: Engine,
    *,
    prefix: str = "/cyclone",
    authorize: Callable[[Mapping[str, Any]], bool] | None = None,
    title: str = "cyclone",
) -> Dashboard:
    """Serve the dashboard at ``prefix`` of the Flask ``app``; returns the dashboard.

    The CSRF secret is the app's ``SECRET_KEY`` when it has one, so every process of the
    app accepts the forms of every other.
    """
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a path (a str), not {type(prefix).__name__}")
    if not prefix.startswith("/") or prefix.endswith("/"):
        raise ValueError(f"prefix must start with '/' and not end with one, got {prefix!r}")
    config = getattr(app, "config", None)
    if config is None or not hasattr(app, "wsgi_app"):
        raise TypeError(f"mount takes the Flask application, not {type(app).__name__}")
    secret = config.get("SECRET_KEY")
    dashboard = create_app(
        engine,
        authorize=authorize,
        title=title,
        secret=None if secret is None else f"cyclone.dashboard:{secret}",
    )
    app.wsgi_app = DispatcherMiddleware(app.wsgi_app, {prefix: dashboard})
    return dashboard
