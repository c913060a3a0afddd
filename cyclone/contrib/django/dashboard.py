"""cyclone's dashboard in a Django project, mounted with an include in the URLconf.

``path("cyclone/", include("cyclone.contrib.django.dashboard"))``: a Django view hands
each request under the mount to the dashboard's WSGI application, with ``SCRIPT_NAME``
set to the mount point so every link and form stays under it. Only staff users see the
pages (others are sent to ``LOGIN_URL``, or get 403 when logged in). The actions (retry,
retry all, cancel) are allowed when ``settings.CYCLONE_DASHBOARD_AUTHORIZE`` (a callable
taking the request, or its dotted path) returns True; by default, for staff users. The
dashboard's forms carry their own CSRF token, signed with a key derived from
``SECRET_KEY``, so the view is exempt from Django's CSRF middleware.
"""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import re_path
from django.utils.module_loading import import_string
from django.views.decorators.csrf import csrf_exempt
from sqlalchemy import Engine

from cyclone.contrib.django import engine
from cyclone.dashboard import Dashboard, create_app

app_name = "cyclone_dashboard"

_AUTHORIZED = "cyclone.contrib.django.authorized"
_lock = threading.Lock()
_apps: dict[Engine, Dashboard] = {}


def _is_staff(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


def _authorize() -> Callable[[HttpRequest], bool]:
    value = getattr(settings, "CYCLONE_DASHBOARD_AUTHORIZE", None)
    if value is None:
        return _is_staff
    found: Callable[[HttpRequest], bool] = import_string(value) if isinstance(value, str) else value
    return found


def _dashboard() -> Dashboard:
    """The dashboard of the engine of ``settings.CYCLONE_DATABASE``."""
    return dashboard_for(engine())


def dashboard_for(current: Engine) -> Dashboard:
    """The dashboard of ``current``, one per engine (the admin's run page draws with it)."""
    with _lock:
        if current not in _apps:
            _apps[current] = create_app(
                current,
                authorize=lambda environ: bool(environ.get(_AUTHORIZED)),
                title=getattr(settings, "CYCLONE_DASHBOARD_TITLE", "cyclone"),
                secret=f"cyclone.dashboard:{settings.SECRET_KEY}",
            )
        return _apps[current]


@csrf_exempt
def dashboard(request: HttpRequest, subpath: str = "") -> HttpResponse:
    """Serve one dashboard request (any page, static file or action) under the mount."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return redirect_to_login(request.get_full_path())
    if not _is_staff(request):
        raise PermissionDenied("the cyclone dashboard is for staff users")
    body = request.body
    environ: dict[str, Any] = dict(request.META)
    mount = request.path[: len(request.path) - len(subpath)].rstrip("/")
    environ.update(
        {
            "SCRIPT_NAME": mount,
            "PATH_INFO": "/" + subpath,
            "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": environ.get("wsgi.errors", sys.stderr),
            "wsgi.url_scheme": request.scheme,
            "wsgi.version": (1, 0),
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
            _AUTHORIZED: _authorize()(request),
        }
    )
    return _call(_dashboard(), environ)


def _call(app: Dashboard, environ: dict[str, Any]) -> HttpResponse:
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started["status"], started["headers"] = status, headers
        return lambda data: None

    chunks: Iterable[bytes] = app(environ, start_response)
    try:
        content = b"".join(chunks)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    response = HttpResponse(content, status=int(started["status"].split(" ", 1)[0]))
    for header, value in started["headers"]:
        if header.lower() == "set-cookie":
            response.cookies.load(SimpleCookie(value))
        else:
            response[header] = value
    return response


urlpatterns = [re_path(r"^(?P<subpath>.*)$", dashboard, name="dashboard")]
