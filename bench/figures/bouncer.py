"""Figure k: figure a's new-key submit through a PgBouncer in transaction pooling mode
in front of the bench server, in turns with the same calls made directly.

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
import sqlalchemy as sa
from sqlalchemy.engine import URL

from bench import measure, workloads
from bench.figures.submit import new_key, raw_new_key
from bench.harness import Bench

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


def fig_k(bench: Bench) -> None:
    """Figure a's 1-step new-key submit through PgBouncer (transaction mode), in turns."""
    if not available():
        print("  k: no /usr/sbin/pgbouncer (apt-get install pgbouncer): skipped")
        return
    n = bench.sizes.new_keys
    f = bench.fig(
        "k",
        "submit_once new key, 1-step, via PgBouncer",
        "submits/s",
        True,
        goal=0.85,
        goal_text=">= 0.85x raw",
        raw_label="raw psycopg via PgBouncer",
    )
    direct = bench.fig(
        "k-ref-direct", "  ref: the same turns, direct", "submits/s", True, raw_label="raw psycopg"
    )
    bench.reset()
    pgb = PgBouncer(bench.url)
    engine = sa.create_engine(pgb.url(), pool_size=5, connect_args={"prepare_threshold": None})
    raw_pgb = psycopg.connect(pgb.dsn(), autocommit=True, prepare_threshold=None)
    raw_direct = bench.raw_conn()
    try:
        wf = workloads.one_step
        rates = measure.interleaved(
            {
                "raw-pgb": (raw_new_key(raw_pgb, "k-raw-pgb"), n),
                "cyc-pgb": (new_key(wf, engine, "k-cyc-pgb"), n),
                "raw": (raw_new_key(raw_direct, "k-raw"), n),
                "cyc": (new_key(wf, bench.engine, "k-cyc"), n),
            }
        )
    finally:
        raw_pgb.close()
        raw_direct.close()
        engine.dispose()
        pgb.stop()
    f.cyclone.append(rates["cyc-pgb"])
    f.raw.append(rates["raw-pgb"])
    direct.cyclone.append(rates["cyc"])
    direct.raw.append(rates["raw"])
    print(
        f"  k: via PgBouncer cyclone {rates['cyc-pgb']:,.0f} / raw {rates['raw-pgb']:,.0f}; "
        f"direct cyclone {rates['cyc']:,.0f} / raw {rates['raw']:,.0f} submits/s"
    )
