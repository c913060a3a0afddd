"""cyclone's web dashboard: a server-rendered WSGI application (extra ``cyclone[dashboard]``).

It shows runs, their DAGs, standalone jobs and backlogs, and, when the application allows
it, retries and cancels them. It runs standalone (:func:`serve`, ``cyclone dashboard``),
behind any WSGI mount (Flask's ``DispatcherMiddleware``, :mod:`cyclone.dashboard.flask`)
and in Django (``include("cyclone.contrib.django.dashboard")``).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from sqlalchemy import Engine

from cyclone.errors import MissingExtraError

# Every module of this package imports this one first: a missing library is named here.
with MissingExtraError.guard(__name__, "dashboard"):
    from cyclone.dashboard._app import Dashboard

__all__ = ["Dashboard", "create_app", "serve"]


def create_app(
    engine: Engine,
    *,
    authorize: Callable[[Mapping[str, Any]], bool] | None = None,
    title: str = "cyclone",
    secret: bytes | str | None = None,
    refresh: float = 5.0,
) -> Dashboard:
    """Build the dashboard's WSGI application for the cyclone schema behind ``engine``.

    Args:
        engine: the Engine of the database cyclone's tables live in.
        authorize: called with the WSGI environ of each request; the actions (retry,
            retry all, cancel, pause and resume of a schedule) are shown and accepted
            only when it returns True. Without it the dashboard is read-only: no
            buttons, and every POST gets 403.
        title: the name in the page header and the browser tab.
        secret: the key that signs the CSRF tokens of the action forms (a non-empty str
            or bytes). Pass the same value to every process serving the dashboard; by
            default each application makes its own at random.
        refresh: seconds between a page's refreshes in the browser: a few lines of
            JavaScript served with the dashboard fetch the page again and swap its
            content in, holding off while the tab is hidden or the user is in a form,
            reading an opened error or selecting text. 0 turns it off; without
            JavaScript pages are the same, and refresh on reload. At most 2,147,483
            (a browser runs a longer interval at once).

    Returns:
        A WSGI application; mount it anywhere (it honours ``SCRIPT_NAME``).

    Raises:
        TypeError: ``engine`` is not an Engine, ``authorize`` is not callable, or
            ``secret`` is not a str or bytes.
        ValueError: ``refresh`` is not a number of seconds from 0 to 2,147,483, or
            ``secret`` is empty.
    """
    return Dashboard(engine, authorize=authorize, title=title, secret=secret, refresh=refresh)


def serve(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8421,
    authorize: Callable[[Mapping[str, Any]], bool] | None = None,
    threads: int = 4,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the dashboard over HTTP with waitress until SIGINT or SIGTERM, then return.

    ``ready`` is called with the dashboard's URL once its socket listens; an address that
    cannot be listened on raises ``OSError`` (or ``ValueError`` for a host waitress
    refuses) before it is called.

    This is what ``cyclone dashboard`` runs. Like gunicorn, it installs its own handlers
    for SIGINT and SIGTERM (so it stops even when its parent ignored SIGINT, as a shell's
    background job does): the first of them stops the loop, ends the request threads and
    closes every socket; the previous handlers are back when it returns. Call it from the
    main thread. It is meant for operators on a private network; put it behind a reverse
    proxy with authentication to expose it further.
    """
    with MissingExtraError.guard(__name__, "dashboard"):
        from waitress import wasyncore
        from waitress.server import create_server

    sockets: dict[int, Any] = {}
    try:
        server = create_server(
            create_app(engine, authorize=authorize),
            map=sockets,
            host=host,
            port=port,
            threads=threads,
        )
    except BaseException:
        # An address in use: waitress had made the socket and its trigger's pipe, in
        # ``sockets``; they were left open (a ResourceWarning, a descriptor per try).
        wasyncore.close_all(sockets)
        raise
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            raise KeyboardInterrupt

    previous = {number: signal.signal(number, stop) for number in _STOP_SIGNALS}
    try:
        if ready is not None:
            ready(_url(host, server))
        server.run()  # waitress ends its loop and its threads on KeyboardInterrupt
    except KeyboardInterrupt:
        pass  # the signal came before waitress's loop began
    finally:
        wasyncore.close_all(sockets)
        for number, handler in previous.items():
            signal.signal(number, handler)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _url(host: str, server: Any) -> str:
    """The dashboard's URL: ``host`` and the port its (first) socket listens on.

    A host name of several addresses (``localhost`` as ``::1`` and ``127.0.0.1``) is
    served by one socket each, in a waitress ``MultiSocketServer``, which has no
    ``effective_port`` but their list. An IPv6 address is bracketed.
    """
    listening = getattr(server, "effective_listen", None)
    port = server.effective_port if listening is None else listening[0][1]
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"
