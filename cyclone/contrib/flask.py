"""Flask integration: ``Cyclone(app)`` gives an application cyclone's engine, worker and CLI.

Needs the ``cyclone[flask]`` extra. The engine is Flask-SQLAlchemy's (``db.engine``, or
the bind named by ``CYCLONE_SQLALCHEMY_BIND``) unless ``CYCLONE_DATABASE_URL`` is set.
Every step a worker of the application runs is inside ``app.app_context()``, so steps may
use ``db.session``: Flask-SQLAlchemy removes the session when that context ends, after
each step. ``flask cyclone ...`` is cyclone's command line on that engine, and
``flask cyclone worker`` runs the workflows and step kinds of ``CYCLONE_WORKER_MODULES``.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy
from sqlalchemy.engine import make_url

from cyclone import errors
from cyclone.worker import Worker
from cyclone.workflow import StandaloneStep, Workflow

with errors.MissingExtraError.guard(__name__, "flask"):
    import flask

    from cyclone.cli import build_cli

__all__ = ["ConfigurationError", "Cyclone", "database_url"]

EXTENSION = "cyclone"

CONFIG_DEFAULTS: Mapping[str, Any] = {
    "CYCLONE_DATABASE_URL": None,
    "CYCLONE_ENGINE_OPTIONS": {},
    "CYCLONE_SQLALCHEMY_BIND": None,
    "CYCLONE_WORKER_MODULES": (),
}

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
    """What the extension keeps per application: its own engine, made once when needed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.engine: sqlalchemy.Engine | None = None


class Cyclone:
    """The Flask extension: ``Cyclone(app)``, or ``cy = Cyclone()`` then ``cy.init_app(app)``.

    The extension holds no application, so one object serves several (the application
    factory pattern); ``app.extensions["cyclone"]`` is the extension of ``app``.
    """

    def __init__(self, app: flask.Flask | None = None) -> None:
        self._states: weakref.WeakKeyDictionary[flask.Flask, _State] = weakref.WeakKeyDictionary()
        if app is not None:
            self.init_app(app)

    def init_app(self, app: flask.Flask) -> None:
        """Register the extension, its config defaults and ``flask cyclone`` on ``app``."""
        for key, value in CONFIG_DEFAULTS.items():
            app.config.setdefault(key, value)
        self._states[app] = _State()
        app.extensions[EXTENSION] = self
        app.cli.add_command(
            build_cli(
                engine=lambda: self.engine_for(app),
                definitions=lambda: self.definitions_for(app),
                worker_options=lambda: {"step_context": app.app_context},
            ),
            "cyclone",
        )

    @property
    def engine(self) -> sqlalchemy.Engine:
        """The engine of the current application (inside an application context)."""
        return self.engine_for(_current_app())

    def engine_for(self, app: flask.Flask) -> sqlalchemy.Engine:
        """The engine cyclone uses for ``app``: its own from ``CYCLONE_DATABASE_URL``, or
        Flask-SQLAlchemy's.

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
