"""Flask integration: ``Cyclone(app)`` gives an application cyclone's engine, worker and CLI.

Needs the ``cyclone[flask]`` extra. The engine is Flask-SQLAlchemy's (``db.engine``, or
the bind named by ``CYCLONE_SQLALCHEMY_BIND``) unless ``CYCLONE_DATABASE_URL`` is set.
Every step a worker of the application runs is inside ``app.app_context()``, so steps may
use ``db.session``: Flask-SQLAlchemy removes the session when that context ends, after
each step. ``flask cyclone ...`` is cyclone's command line on that engine, and
``flask cyclone worker`` runs the workflows and step kinds of ``CYCLONE_WORKER_MODULES``.
``Cyclone(app, dashboard="/cyclone", authorize=...)`` also serves the dashboard at that
path, as views of the app: ``authorize`` runs in Flask's request context.
"""

from __future__ import annotations

import importlib
import io
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy
from sqlalchemy.engine import make_url

from cyclone import errors
from cyclone.worker import Worker
from cyclone.workflow import StandaloneStep, Workflow

with errors.MissingExtraError.guard(__name__, "flask"):
    import flask
    import werkzeug.wrappers

    from cyclone.cli import build_cli

if TYPE_CHECKING:
    from cyclone.dashboard import Dashboard

__all__ = ["ConfigurationError", "Cyclone", "database_url"]

EXTENSION = "cyclone"

CONFIG_DEFAULTS: Mapping[str, Any] = {
    "CYCLONE_DATABASE_URL": None,
    "CYCLONE_ENGINE_OPTIONS": {},
    "CYCLONE_SQLALCHEMY_BIND": None,
    "CYCLONE_WORKER_MODULES": (),
    "CYCLONE_DASHBOARD_TITLE": "cyclone",
}

DATABASE_HELP = (
    "the Flask app's: the CYCLONE_DATABASE_URL of its config, else Flask-SQLAlchemy's "
    "engine (db.engine, or the bind CYCLONE_SQLALCHEMY_BIND names)"
)
"""Where ``flask cyclone`` finds the database, as its ``--help`` says."""

BLUEPRINT = "cyclone_dashboard"
"""The name of the dashboard's blueprint: ``url_for("cyclone_dashboard.page", subpath="runs")``."""

Authorize = Callable[[flask.Request], bool]
ViewDecorator = Callable[[Callable[..., Any]], Callable[..., Any]]

_AUTHORIZED = "cyclone.contrib.flask.authorized"
_UNSET: Any = object()

Definitions = tuple[list[Workflow[Any]], list[StandaloneStep[Any, Any]]]


class ConfigurationError(errors.CycloneError):
    """The application's cyclone configuration cannot work (no database, a wrong driver...)."""

    def __init__(self, message: str) -> None:
        self._message = message
        super().__init__(message)


def database_url(url: str | sqlalchemy.URL) -> sqlalchemy.URL:
    """``url`` for psycopg 3: ``postgresql://`` and ``postgres://`` get the ``+psycopg`` driver.

    Raises:
        ConfigurationError: the URL is not PostgreSQL, or names another driver.
    """
    try:
        parsed = make_url(url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise ConfigurationError(f"CYCLONE_DATABASE_URL is not a database URL: {exc}") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend not in ("postgresql", "postgres"):
        raise ConfigurationError(
            f"cyclone needs PostgreSQL; CYCLONE_DATABASE_URL names {parsed.drivername!r}"
        )
    if driver not in ("", "psycopg"):
        raise ConfigurationError(
            f"cyclone needs the psycopg 3 driver; CYCLONE_DATABASE_URL names {driver!r}: "
            "use postgresql+psycopg://..."
        )
    return parsed.set(drivername="postgresql+psycopg")


def load_definitions(modules: Sequence[str]) -> Definitions:
    """The workflows and standalone step kinds defined at the top level of ``modules``.

    Raises:
        ConfigurationError: a module cannot be imported, or defines neither.
    """
    if isinstance(modules, str):
        modules = [modules]
    workflows: list[Workflow[Any]] = []
    steps: list[StandaloneStep[Any, Any]] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(
                f"CYCLONE_WORKER_MODULES names {name!r}, which cannot be imported: {exc}"
            ) from exc
        found = 0
        for value in vars(module).values():
            if isinstance(value, Workflow):
                found += 1
                if value not in workflows:
                    workflows.append(value)
            elif isinstance(value, StandaloneStep):
                found += 1
                if value not in steps:
                    steps.append(value)
        if not found:
            raise ConfigurationError(
                f"module {name!r} of CYCLONE_WORKER_MODULES defines no cyclone workflow or step"
            )
    return workflows, steps


class _State:
    """What the extension keeps per application: its own engine and its dashboard, each
    made once, when first needed."""

    def __init__(self, authorize: Authorize | None) -> None:
        self.lock = threading.Lock()
        self.engine: sqlalchemy.Engine | None = None
        self.authorize = authorize
        self.dashboard_lock = threading.Lock()
        self.dashboard: Dashboard | None = None


class Cyclone:
    """The Flask extension: ``Cyclone(app)``, or ``cy = Cyclone()`` then ``cy.init_app(app)``.

    The extension holds no application, so one object serves several (the application
    factory pattern); ``app.extensions["cyclone"]`` is the extension of ``app``.

    Args:
        app: the application to initialise now (else call :meth:`init_app`).
        dashboard: serve cyclone's dashboard (extra ``cyclone[dashboard]``) at this path
            of the app, e.g. ``"/cyclone"``; None (the default) serves none.
        authorize: called with ``flask.request``, inside Flask's request context (so
            ``flask.session``, ``flask.g`` and Flask-Login's ``current_user`` work), on
            every dashboard request; the dashboard's actions (retry, cancel, pause...)
            are shown and accepted only when it returns True. Without it the dashboard
            is read-only.
        dashboard_decorators: view decorators wrapped around the dashboard's view, first
            innermost, as ``MethodView.decorators`` (e.g. Flask-Login's
            ``login_required``): who may see the pages at all.

    :meth:`init_app` takes the same keywords, for one application.
    """

    def __init__(
        self,
        app: flask.Flask | None = None,
        *,
        dashboard: str | None = None,
        authorize: Authorize | None = None,
        dashboard_decorators: Sequence[ViewDecorator] = (),
    ) -> None:
        self._states: weakref.WeakKeyDictionary[flask.Flask, _State] = weakref.WeakKeyDictionary()
        self._dashboard = dashboard
        self._authorize = authorize
        self._decorators = tuple(dashboard_decorators)
        if app is not None:
            self.init_app(app)

    def init_app(
        self,
        app: flask.Flask,
        *,
        dashboard: str | None = _UNSET,
        authorize: Authorize | None = _UNSET,
        dashboard_decorators: Sequence[ViewDecorator] = _UNSET,
    ) -> None:
        """Register the extension, its config defaults and ``flask cyclone`` on ``app``, and
        the dashboard's views when a ``dashboard`` path is given (here, else to the
        constructor)."""
        if not isinstance(app, flask.Flask):
            raise TypeError(f"init_app takes the Flask application, not {type(app).__name__}")
        prefix = self._dashboard if dashboard is _UNSET else dashboard
        chosen = self._authorize if authorize is _UNSET else authorize
        # A non-callable authorize failed every dashboard request with a 500; say so here.
        if chosen is not None and not callable(chosen):
            raise TypeError(f"authorize must be callable or None, not {type(chosen).__name__}")
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(
                f"dashboard must be a path (a str) or None, not {type(prefix).__name__}"
            )
        if prefix is not None and (not prefix.startswith("/") or prefix.endswith("/")):
            raise ValueError(
                f"dashboard must be a path starting with '/' and not ending with one, "
                f"got {prefix!r}"
            )
        for key, value in CONFIG_DEFAULTS.items():
            app.config.setdefault(key, value)
        self._states[app] = _State(chosen)
        app.extensions[EXTENSION] = self
        app.cli.add_command(
            build_cli(
                engine=lambda: self.engine_for(app),
                definitions=lambda: self.definitions_for(app),
                worker_options=lambda: {"step_context": app.app_context},
                database=DATABASE_HELP,
            ),
            "cyclone",
        )
        if prefix is not None:
            decorators = (
                self._decorators if dashboard_decorators is _UNSET else dashboard_decorators
            )
            app.register_blueprint(self._blueprint(decorators), url_prefix=prefix)

    def _blueprint(self, decorators: Sequence[ViewDecorator]) -> flask.Blueprint:
        with errors.MissingExtraError.guard(__name__, "dashboard"):
            import cyclone.dashboard  # noqa: F401  (named now, not at the first request)
        view: Callable[..., Any] = self._serve_dashboard
        for decorate in decorators:
            view = decorate(view)
        blueprint = flask.Blueprint(BLUEPRINT, __name__)
        methods = ["GET", "POST"]
        blueprint.add_url_rule("/", "page", view, methods=methods, defaults={"subpath": ""})
        blueprint.add_url_rule("/<path:subpath>", "page", view, methods=methods)
        return blueprint

    def _serve_dashboard(self, subpath: str) -> werkzeug.wrappers.Response:
        """One dashboard request (a page, a static file or an action), in Flask's request
        context: ``authorize`` is asked here, the dashboard's WSGI application answers."""
        app = _current_app()
        state = self._state(app)
        request = flask.request
        allowed = state.authorize is not None and bool(
            state.authorize(request._get_current_object())  # type: ignore[attr-defined]
        )
        body = request.get_data(cache=True)
        mount = request.path[: len(request.path) - len(subpath)].rstrip("/")
        environ = dict(request.environ)
        environ.update(
            {
                "SCRIPT_NAME": request.root_path + mount,
                "PATH_INFO": "/" + subpath,
                "CONTENT_LENGTH": str(len(body)),
                "wsgi.input": io.BytesIO(body),
                _AUTHORIZED: allowed,
            }
        )
        return werkzeug.wrappers.Response.from_app(self._dashboard_for(app, state), environ)

    def _dashboard_for(self, app: flask.Flask, state: _State) -> Dashboard:
        """The dashboard of ``app``, made at its first request (inside its contexts, so
        Flask-SQLAlchemy's engine is there)."""
        if state.dashboard is None:
            engine = self.engine_for(app)
            with state.dashboard_lock:
                if state.dashboard is None:
                    from cyclone.dashboard import create_app

                    secret = app.config.get("SECRET_KEY")
                    state.dashboard = create_app(
                        engine,
                        authorize=lambda environ: bool(environ.get(_AUTHORIZED)),
                        title=str(app.config.get("CYCLONE_DASHBOARD_TITLE") or "cyclone"),
                        secret=None if secret is None else f"cyclone.dashboard:{secret}",
                    )
        return state.dashboard

    @property
    def engine(self) -> sqlalchemy.Engine:
        """The engine of the current application (inside an application context)."""
        return self.engine_for(_current_app())

    def engine_for(self, app: flask.Flask) -> sqlalchemy.Engine:
        """The engine cyclone uses for ``app``: its own from ``CYCLONE_DATABASE_URL``, or
        Flask-SQLAlchemy's. Unlike :attr:`engine` it needs no application context (it
        enters ``app``'s to ask Flask-SQLAlchemy), so it works at import or setup time.

        Raises:
            ConfigurationError: neither is configured, or the engine's driver is not psycopg 3.
        """
        state = self._state(app)
        url = app.config.get("CYCLONE_DATABASE_URL")
        if url:
            with state.lock:
                if state.engine is None:
                    options = dict(app.config.get("CYCLONE_ENGINE_OPTIONS") or {})
                    state.engine = sqlalchemy.create_engine(database_url(url), **options)
                return state.engine
        db = app.extensions.get("sqlalchemy")
        if db is None:
            raise ConfigurationError(
                f"Flask app {app.name!r} has no database for cyclone: set "
                "CYCLONE_DATABASE_URL, or initialise Flask-SQLAlchemy on the app"
            )
        bind = app.config.get("CYCLONE_SQLALCHEMY_BIND")
        with app.app_context():
            engines: Mapping[str | None, sqlalchemy.Engine] = db.engines
            if bind not in engines:
                raise ConfigurationError(
                    f"CYCLONE_SQLALCHEMY_BIND names {bind!r}, which is not a bind of "
                    f"Flask-SQLAlchemy on app {app.name!r} (binds: {sorted(map(str, engines))})"
                )
            engine = engines[bind]
        if engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
            raise ConfigurationError(
                f"cyclone needs PostgreSQL with psycopg 3; Flask-SQLAlchemy's engine uses "
                f"{engine.dialect.name}+{engine.dialect.driver}: use a postgresql+psycopg:// "
                "URL, or set CYCLONE_DATABASE_URL"
            )
        return engine

    def definitions_for(self, app: flask.Flask) -> Definitions:
        """The workflows and step kinds of ``CYCLONE_WORKER_MODULES`` (what the worker runs)."""
        modules = app.config.get("CYCLONE_WORKER_MODULES") or ()
        if not modules:
            raise ConfigurationError(
                f"Flask app {app.name!r} sets no CYCLONE_WORKER_MODULES: list the modules "
                "defining the workflows and steps its worker runs, or name them on the "
                "command line"
            )
        return load_definitions(modules)

    def worker(self, app: flask.Flask | None = None, **options: Any) -> Worker:
        """A :class:`cyclone.Worker` for ``app`` (default: the current one).

        It runs the definitions of ``CYCLONE_WORKER_MODULES`` unless ``workflows=`` or
        ``steps=`` are given, every step inside the application's context.
        """
        app = app or _current_app()
        if "workflows" not in options and "steps" not in options:
            options["workflows"], options["steps"] = self.definitions_for(app)
        options.setdefault("step_context", app.app_context)
        return Worker(self.engine_for(app), **options)

    def _state(self, app: flask.Flask) -> _State:
        state = self._states.get(app)
        if state is None:
            raise ConfigurationError(
                f"cyclone is not initialised on Flask app {app.name!r}: call Cyclone(app) "
                "or Cyclone().init_app(app)"
            )
        return state


def _current_app() -> flask.Flask:
    app: flask.Flask = flask.current_app._get_current_object()  # type: ignore[attr-defined]
    return app
