"""A private PostgreSQL cluster a test starts, stops and starts again (never the shared one).

``initdb`` runs as an unprivileged OS user (``postgres`` when the tests run as root) into
a temporary directory, and the server listens on a free port of 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import sqlalchemy as sa

from tests.support import processes


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """``start()``, ``stop()``, ``start()`` again; ``url`` for SQLAlchemy; ``remove()``."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
        self.bindir = bindir
        self.port = _free_port()
        self.base = Path(tempfile.mkdtemp(prefix="cyclone-cluster-"))
        self.data = self.base / "data"
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            shutil.chown(self.base, self.user)
        self._as_user(
            str(bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                "unix_socket_directories = ''\nfsync = off\n"
            )
        self.url = sa.make_url(f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres")

    def _as_user(self, *command: str) -> None:
        prefix = ["runuser", "-u", self.user, "--"] if self.user is not None else []
        processes.run([*prefix, *command], check=True, cwd="/", capture_output=True, timeout=120)

    def start(self) -> None:
        self._as_user(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-t",
            "60",
            "-l",
            str(self.base / "log"),
            "start",
        )

    def stop(self) -> None:
        self._as_user(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-t",
            "60",
            "-m",
            "immediate",
            "stop",
        )

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
