"""cyclone's alembic environment: its own version table, a shared connection when given one.

``cyclone.upgrade(engine)`` passes a connection through ``config.attributes["connection"]``;
``alembic upgrade head`` from the repository root builds one from ``CYCLONE_DATABASE_URL``.
"""

import os

from sqlalchemy import create_engine

from alembic import context

VERSION_TABLE = "cyclone_alembic_version"

config = context.config


def _target_metadata():
    try:
        from cyclone.schema import metadata
    except ImportError:
        return None
    return metadata


def _include_name(name, type_, parent_names):
    if type_ == "table":
        return name is not None and name.startswith("cyclone_") and name != VERSION_TABLE
    return True


def _configure(connection):
    context.configure(
        connection=connection,
        target_metadata=_target_metadata(),
        version_table=VERSION_TABLE,
        include_name=_include_name,
        compare_type=True,
    )


def run_migrations_offline():
    url = os.environ.get("CYCLONE_DATABASE_URL", "postgresql+psycopg://")
    nested = config.attributes.get("output_buffer")
    if nested is not None:
        # Inside an application's `alembic upgrade --sql`: write into its script, inside
        # its BEGIN/COMMIT.
        context.configure(
            url=url,
            version_table=VERSION_TABLE,
            literal_binds=True,
            dialect_opts={"paramstyle": "named"},
            output_buffer=nested,
            transactional_ddl=False,
        )
        context.run_migrations()
        return
    context.configure(
        url=url,
        version_table=VERSION_TABLE,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online():
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = os.environ.get("CYCLONE_DATABASE_URL")
    if not url:
        raise SystemExit("set CYCLONE_DATABASE_URL to the database to migrate")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
