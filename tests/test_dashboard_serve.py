"""``cyclone.dashboard.serve()`` called from Python returns on SIGINT or SIGTERM, leaving the
caller's handlers of both signals as they were and its port closed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from sqlalchemy.engine import URL

from tests.test_cli import ROOT, closed_port

SCRIPT = textwrap.dedent(
    """
    import signal, socket, sys, threading, os, urllib.request
    import sqlalchemy as sa
    from cyclone.dashboard import serve

    url, port, stop = sys.argv[1], int(sys.argv[2]), signal.Signals[sys.argv[3]]

    def own(signum, frame):
        pass

    signal.signal(signal.SIGTERM, own)
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stop_once_served():
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    print("served", page.status, flush=True)
                    break
            except OSError:
                threading.Event().wait(0.02)
        os.kill(os.getpid(), stop)

    threading.Thread(target=stop_once_served, daemon=True).start()
    engine = sa.create_engine(url)
    serve(engine, port=port, threads=2)
    print("returned", signal.getsignal(signal.SIGTERM) is own,
          signal.getsignal(signal.SIGINT) is signal.SIG_IGN, flush=True)
    with socket.socket() as probe:
        print("closed", probe.connect_ex(("127.0.0.1", port)) != 0, flush=True)
    """
)


@pytest.mark.processes
@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_serve_returns_on_a_signal_with_the_callers_handlers_back_and_its_port_closed(
    database_url: URL, stop: str
) -> None:
    port = closed_port()
    url = database_url.render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, str(port), stop],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        start_new_session=True,
    )
    assert (done.returncode, done.stdout.splitlines()) == (
        0,
        ["served 200", "returned True True", "closed True"],
    ), done.stderr
    assert done.stderr == ""
