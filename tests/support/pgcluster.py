"""A private PostgreSQL cluster for tests that restart, stop or cut off the server.

It is made like scripts/env.sh makes its private cluster: the distribution's server
binaries, ``initdb`` run as an unprivileged OS user when we are root (PostgreSQL refuses
to run as root), trust authentication on 127.0.0.1 only, fsync off. It lives in a
temporary directory, listens on a port picked free at start, and is removed by
:meth:`Cluster.destroy`.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL

from tests.support import at_rest, processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def server_bindir() -> Path | None:
    """The newest PostgreSQL server binaries installed, if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    found += [p for p in [shutil.which("initdb")] if p]
    return Path(found[-1]).parent if found else None


def unprivileged_user() -> str | None:
    """The OS user to run PostgreSQL as when we are root: ``postgres``, else scripts/env.sh's."""
    if os.getuid() != 0:
        return None
    for name in ("postgres", os.environ.get("CYCLONE_PG_USER", "cyclonepg")):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root, and no unprivileged user (postgres) to run PostgreSQL")


class Cluster:
    """One throwaway cluster: :meth:`start`, :meth:`stop`, :meth:`restart`, :meth:`destroy`."""

    def __init__(self, bindir: Path, os_user: str | None = None) -> None:
        self.bindir = bindir
        self.os_user = (
            os_user if os_user is not None else ("postgres" if os.getuid() == 0 else None)
        )
        self.base = Path(tempfile.mkdtemp(prefix="cyclone-reliability-"))
        if self.os_user is not None:
            pw = pwd.getpwnam(self.os_user)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self.port = free_port()
        self._pg(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        conf = (
            "listen_addresses = '127.0.0.1'\n"
            f"port = {self.port}\n"
            "unix_socket_directories = ''\n"
            "fsync = off\n"
            "full_page_writes = off\n"
            "max_connections = 300\n"
            "deadlock_timeout = 100ms\n"
        )
        self._pg("sh", "-c", f"cat >> {self.data}/postgresql.conf", stdin=conf)

    def _pg(self, program: str, *args: str, stdin: str | None = None) -> None:
        exe = str(self.bindir / program) if (self.bindir / program).exists() else program
        command = [exe, *args]
        if self.os_user is not None:
            command = ["runuser", "-u", self.os_user, "--", *command]
        processes.run(
            command, input=stdin, text=True, check=True, cwd="/", capture_output=True, timeout=120
        )

    def url(self, database: str = "postgres") -> URL:
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host="127.0.0.1",
            port=self.port,
            database=database,
        )

    def start(self) -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        self.wait_ready()

    def stop(self, mode: str = "fast") -> None:
        self._pg("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "stop", "-m", mode)

    def restart(self, mode: str = "fast") -> None:
        self._pg(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            "60",
            "restart",
            "-m",
            mode,
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user="postgres",
                    dbname="postgres",
                    connect_timeout=2,
                ).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # a poll until it accepts connections

    def create_database(self, name: str) -> URL:
        """A new database on the cluster, checked at rest after the test that creates it."""
        admin = sa.create_engine(self.url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        at_rest.touch(self.url(name))
        return self.url(name)

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)
