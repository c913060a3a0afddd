"""A PgBouncer in transaction pooling mode that a test starts in front of the test server.

Debian's ``pgbouncer`` (installed by scripts/debian-packages.sh) runs in the foreground as an
unprivileged OS user (``postgres`` when the tests run as root), on a free port of
127.0.0.1, with ``auth_type = trust``; it forwards every database name to the server of
``CYCLONE_DATABASE_URL``. Version 1.18 has no prepared-statement support, so clients
must turn psycopg's off.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL

from tests.support import processes
from tests.support.cluster import _free_port

BINARY = "/usr/sbin/pgbouncer"


class PgBouncer:
    """``start()``, ``url_for(url)`` (the same database through PgBouncer), ``stop()``."""

    def __init__(self, server: URL, *, pool_size: int = 4) -> None:
        self.server = server
        self.port = _free_port()
        self.base = Path(tempfile.mkdtemp(prefix="cyclone-pgbouncer-"))
        self.user = "postgres" if os.geteuid() == 0 else None
        user = server.username or "postgres"
        (self.base / "users.txt").write_text(f'"{user}" ""\n')
        (self.base / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.base / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.base / 'pgbouncer.log'}\n"
        )
        if self.user is not None:
            for path in (self.base, *self.base.iterdir()):
                shutil.chown(path, self.user)
        self._process: subprocess.Popen[bytes] | None = None

    def url_for(self, url: URL) -> URL:
        """``url``'s database, reached through this PgBouncer."""
        return url.set(host="127.0.0.1", port=self.port)

    def start(self) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user is not None else []
        self._process = processes.popen(
            [*prefix, BINARY, str(self.base / "pgbouncer.ini")],
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        target = self.url_for(self.server)
        while True:
            try:
                psycopg.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user=target.username or "postgres",
                    dbname=target.database or "postgres",
                    connect_timeout=2,
                ).close()
                return
            except psycopg.OperationalError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"pgbouncer did not start:\n{self.log()}") from None
                time.sleep(0.05)  # a poll until it accepts connections

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.base / "pgbouncer.log").read_text()
        return ""

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        self._process = None
        shutil.rmtree(self.base, ignore_errors=True)


def engine(url: URL, **kwargs: object) -> sa.Engine:
    """An engine through PgBouncer: psycopg's server-side prepared statements off."""
    return sa.create_engine(url, connect_args={"prepare_threshold": None}, **kwargs)  # type: ignore[arg-type]
