"""The command line's database: the URL, the Engine, the schema check, and one-line errors.

Every failure a command reports is a :class:`CommandError`: one line on stderr and an
exit status from the table below (documented in docs/cli.md).
"""

from __future__ import annotations

import os
import re
import traceback
from typing import IO, Any

import click
import psycopg
from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from cyclone import errors, migrations

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_SCHEMA = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141

CONNECT_TIMEOUT = 10


class CommandError(click.ClickException):
    """An error reported as one line ``cyclone: message`` on stderr, with its exit status."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"cyclone: {self.format_message()}", file=file, err=file is None)


class BadInput(CommandError):
    """A bad URL, module or revision on the command line."""

    exit_code = EXIT_USAGE


class Unreachable(CommandError):
    """The database server cannot be reached (or the connection was lost)."""

    exit_code = EXIT_UNREACHABLE


class NotMigrated(CommandError):
    """The database has no cyclone schema, or an older one."""

    exit_code = EXIT_SCHEMA


def print_cause(exc: BaseException) -> None:
    """Print the traceback behind an error (``-v``), before its one-line message."""
    cause = exc.__cause__ or exc
    click.echo("".join(traceback.format_exception(cause)).rstrip(), err=True)


def _masked(raw: str) -> str:
    return re.sub(r"(//[^/:@]*:)[^@/]*@", r"\1***@", raw)


def database_url(raw: str) -> URL:
    """Parse a database URL; ``postgresql://`` and ``postgres://`` mean psycopg 3.

    Raises:
        CommandError: not a URL, not PostgreSQL, or another driver than psycopg 3.
    """
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise BadInput(
            f"invalid database URL {_masked(raw)!r}: expected postgresql://USER@HOST:PORT/DBNAME"
        ) from None
    backend, _, driver = url.drivername.partition("+")
    if backend not in ("postgresql", "postgres"):
        raise BadInput(
            f"database URL {url.render_as_string()!r} is not PostgreSQL: "
            "cyclone runs on PostgreSQL (postgresql://USER@HOST:PORT/DBNAME)"
        )
    if driver not in ("", "psycopg"):
        raise BadInput(
            f"database URL {url.render_as_string()!r} names the driver {driver!r}: "
            "cyclone uses psycopg 3, write postgresql+psycopg:// (or just postgresql://)"
        )
    return url.set(drivername="postgresql+psycopg")


def where(url: URL) -> str:
    """Host, port and database of a URL, as an error message names them."""
    host = url.host or url.query.get("host") or "localhost"
    if isinstance(host, tuple):
        host = ",".join(host)
    return f"{host}:{url.port or 5432} (database {url.database or url.username or '?'})"


def make_engine(raw: str, command: str = "cyclone") -> Engine:
    """An Engine for a URL given on the command line (psycopg 3, a connect timeout).

    Its connections name ``command`` as their ``application_name``, so that an operator
    tells ``cyclone worker``'s backends apart in ``pg_stat_activity``, unless the URL or
    ``$PGAPPNAME`` names one already.
    """
    url = database_url(raw)
    args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        args["connect_timeout"] = CONNECT_TIMEOUT
    if "application_name" not in url.query and not os.environ.get("PGAPPNAME"):
        args["application_name"] = command
    try:
        return create_engine(url, connect_args=args)
    except NoSuchModuleError as exc:  # pragma: no cover - database_url admits psycopg only
        raise BadInput(str(exc)) from exc


def _reason(exc: BaseException) -> str:
    """The server's or libpq's reason in a psycopg error, without its hints."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    first = first.rsplit(" failed: ", 1)[-1]
    return re.sub(r"^(FATAL|ERROR):\s+", "", first)


def probe(engine: Engine) -> None:
    """Open and close one connection, so an unreachable server is one clear error."""
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        raise unreachable(engine, exc) from exc


def unreachable(engine: Engine, exc: BaseException) -> CommandError:
    return Unreachable(f"cannot connect to PostgreSQL at {where(engine.url)}: {_reason(exc)}")


def known_revisions() -> frozenset[str]:
    """Every revision this version of cyclone ships."""
    return migrations.revision_ids()


def require_schema(engine: Engine, command_path: str, *, allow_newer: bool = False) -> None:
    """Exit with EXIT_SCHEMA, naming the command of the database's mode, unless the schema
    is this version's.

    ``allow_newer`` lets a worker start on a revision newer than it knows (a rolling
    deploy that migrated first): the worker's own check at start logs the warning.
    """
    try:
        migrations.check_schema(engine)
    except errors.SchemaError as exc:
        found = migrations.current_revision(engine)
        if allow_newer and found is not None and found not in known_revisions():
            return
        raise schema_error(engine, command_path, exc) from exc


def schema_error(engine: Engine, command_path: str, exc: BaseException) -> CommandError:
    """The one line for a schema that is missing, old or newer, with the fix of its mode:
    ``migrate`` in the own-table mode, the application's ``alembic upgrade heads`` in the
    shared-history mode, both when the database cannot tell (see ``Found.maybe_shared``)."""
    found = migrations.find(engine)
    expected = migrations.head_revision()
    migrate = f"`{command_path} migrate`"
    at = f"the database at {where(engine.url)}"
    if found.revision is not None and found.revision not in known_revisions():
        message = (
            f"{at} is at cyclone revision {found.revision}, which this version of cyclone "
            f"does not know (it needs {expected}): upgrade cyclone"
        )
    elif found.revision == expected:
        message = str(exc)
    elif found.mode == "shared":
        message = (
            f"{at} is at cyclone revision {found.revision} in your application's alembic "
            f"history ({migrations.SHARED_MODE}), this version needs {expected}: "
            "run `alembic upgrade heads` in your application"
        )
    elif found.maybe_shared:
        message = f"{at} has no cyclone schema: {migrations.fix_either(migrate)}"
    elif found.revision is None:
        message = f"{at} has no cyclone schema: run {migrate}"
    else:
        message = (
            f"{at} is at cyclone revision {found.revision}, this version needs {expected}: "
            f"run {migrate}"
        )
    return NotMigrated(message)


def refuse_shared(engine: Engine, command_path: str) -> None:
    """Exit with one line, before anything is written, when ``migrate`` meets a database
    whose cyclone revisions are in the application's alembic history."""
    found = migrations.find(engine)
    if found.mode == "shared":
        raise CommandError(
            f"the database at {where(engine.url)} is in the {migrations.SHARED_MODE} "
            f"(cyclone's revisions are in your application's alembic_version, at "
            f"{found.revision}): `{command_path} migrate` is for the {migrations.OWN_MODE}; "
            "run `alembic upgrade heads` in your application"
        )


def translate(exc: Exception, engine: Engine | None, command_path: str) -> CommandError:
    """The one-line error for an exception a command let through."""
    if isinstance(exc, errors.SchemaError) and engine is not None:
        return schema_error(engine, command_path, exc)
    if isinstance(exc, errors.SchemaError):
        return NotMigrated(str(exc))
    if isinstance(exc, DBAPIError) and isinstance(exc.orig, psycopg.OperationalError):
        if engine is not None:
            return Unreachable(
                f"lost the connection to PostgreSQL at {where(engine.url)}: {_reason(exc)}"
            )
        return Unreachable(f"database error: {_reason(exc)}")
    if isinstance(exc, DBAPIError):
        return CommandError(f"database error: {_reason(exc)}")
    if isinstance(exc, errors.CycloneError):
        return CommandError(str(exc))
    return CommandError(f"{type(exc).__name__}: {exc}")
