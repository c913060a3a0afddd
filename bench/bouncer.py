"""A PgBouncer in transaction pooling mode in front of the bench server, for figure k.

Debian's ``pgbouncer`` (``apt-get install pgbouncer``; scripts/env.sh installs it when
root) runs in the foreground as ``postgres`` when the bench runs as root, on a free port
of 127.0.0.1, with ``auth_type = trust``, forwarding every database to the bench server.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from sqlalchemy.engine import URL

BINARY = "/usr/sbin/pgbouncer"


def available() -> bool:
    return os.access(BINARY, os.X_OK)


class PgBouncer:
    def __init__(self, server: URL, pool_size: int = 8) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.server = server
        self.base = Path(tempfile.mkdtemp(prefix="cyclone-bench-pgbouncer-"))
        self.user = "postgres" if os.geteuid() == 0 else None
        (self.base / "users.txt").write_text(f'"{server.username or "postgres"}" ""\n')
        (self.base / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.base / 'users.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\n"
            f"admin_users = {server.username or 'postgres'}\n"
            "max_client_conn = 500\nignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.base / 'pgbouncer.log'}\n"
        )
        if self.user is not None:
            for path in (self.base, *self.base.iterdir()):
                shutil.chown(path, self.user)
        prefix = ["runuser", "-u", self.user, "--"] if self.user is not None else []
        self.process = subprocess.Popen(
            [*prefix, BINARY, str(self.base / "pgbouncer.ini")],
            cwd="/",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("pgbouncer did not start") from None
                time.sleep(0.05)

    def url(self) -> URL:
        """The bench database through PgBouncer."""
        return self.server.set(host="127.0.0.1", port=self.port)

    def dsn(self) -> str:
        url = self.url()
        return f"host=127.0.0.1 port={self.port} user={url.username} dbname={url.database}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)
