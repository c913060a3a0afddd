"""Every snippet of docs/dashboard.md and of the README's dashboard section runs as shown."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from werkzeug.test import Client

import cyclone
from tests.conftest import wait_until
from tests.support import processes
from tests.support.dashboard import Order, csrf_token, shop
from tests.support.docs import ROOT, fenced_blocks, snippet, snippets

DOC = "docs/dashboard.md"
EXECUTED = {
    "authorize",
    "cli",
    "flask-extension",
    "flask-dispatcher",
    "flask-mount",
    "django-urls",
}


@pytest.fixture
def doc_env(database_url: URL, monkeypatch: pytest.MonkeyPatch) -> str:
    url = database_url.render_as_string(hide_password=False)
    monkeypatch.setenv("CYCLONE_DATABASE_URL", url)
    return url


def run_snippet(name: str, source: str = DOC) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"snippet_{name.replace('-', '_')}"}
    exec(snippet(source, name), namespace)
    return namespace


def test_every_block_of_the_page_is_a_named_snippet_a_test_runs() -> None:
    assert set(snippets(DOC)) == EXECUTED
    assert fenced_blocks(DOC) == len(EXECUTED)
    assert set(snippets("README.md")) >= {"readme-dashboard"}
    assert fenced_blocks("README.md", start="## Dashboard", end="\n## ") == 1
    for picture in ("dashboard", "dashboard-parked", "dashboard-bulk", "dashboard-queues"):
        assert (ROOT / "docs" / f"{picture}.png").stat().st_size > 10_000
        assert f"]({picture}.png)" in (ROOT / DOC).read_text()


def test_authorize_snippet_allows_actions_only_to_the_named_users(
    doc_env: str, engine: sa.Engine, name: str
) -> None:
    namespace = run_snippet("authorize")
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    s.worker(engine).drain()
    client = Client(namespace["app"])
    guest = client.get(f"/runs/{run.id}").get_data(as_text=True)
    assert "<title>Run" in guest
    assert 'method="post"' not in guest
    alice = {"REMOTE_USER": "alice"}
    page = client.get(f"/runs/{run.id}", environ_overrides=alice).get_data(as_text=True)
    assert "shop · cyclone" in page
    answer = client.post(
        f"/runs/{run.id}/retry", data={"csrf_token": csrf_token(page)}, environ_overrides=alice
    )
    assert answer.status_code == 303
    assert run.status().state == cyclone.RunState.RUNNING
    namespace["engine"].dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.processes
@pytest.mark.parametrize(("source", "name"), [(DOC, "cli"), ("README.md", "readme-dashboard")])
def test_cli_snippet_serves_the_dashboard(doc_env: str, source: str, name: str) -> None:
    port = free_port()
    command = snippet(source, name).replace("8421", str(port))
    assert str(port) in command
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    server = processes.popen(
        ["bash", "-c", f"exec {command}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def runs_page() -> str | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/runs") as answer:
                    return str(answer.read().decode())
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, server.communicate()[1]
                return None

        body = wait_until(runs_page, timeout=30)
        assert "<h1>Runs</h1>" in body
        assert "read-only" in body
    finally:
        server.terminate()
        server.communicate(timeout=10)


def test_flask_dispatcher_snippet_serves_flask_and_the_dashboard(
    doc_env: str, engine: sa.Engine, name: str
) -> None:
    namespace = run_snippet("flask-dispatcher")
    app = namespace["app"]

    @app.get("/")
    def home() -> str:
        return "shop"

    client = app.test_client()
    assert client.get("/").get_data(as_text=True) == "shop"
    assert "<h1>Overview</h1>" in client.get("/admin/cyclone/").get_data(as_text=True)
    namespace["engine"].dispose()


def test_flask_mount_snippet_lets_an_authenticated_user_act(
    doc_env: str, engine: sa.Engine, name: str
) -> None:
    namespace = run_snippet("flask-mount")
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    client = namespace["app"].test_client()
    anonymous = client.post(f"/admin/cyclone/runs/{run.id}/cancel", data={"csrf_token": "x"})
    assert anonymous.status_code == 403
    user = {"REMOTE_USER": "ops"}
    page = client.get(f"/admin/cyclone/runs/{run.id}", environ_base=user).get_data(as_text=True)
    answer = client.post(
        f"/admin/cyclone/runs/{run.id}/cancel",
        data={"csrf_token": csrf_token(page)},
        environ_base=user,
    )
    assert answer.status_code == 303
    assert run.status().state == cyclone.RunState.CANCELLED
    namespace["engine"].dispose()


def test_flask_extension_snippet_asks_authorize_in_the_request_context(
    doc_env: str, engine: sa.Engine, name: str
) -> None:
    namespace = run_snippet("flask-extension")
    app, db = namespace["app"], namespace["db"]
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    client = app.test_client()
    guest = client.get(f"/admin/cyclone/runs/{run.id}").get_data(as_text=True)
    assert "read-only" in guest
    with client.session_transaction() as session:
        session["role"] = "operator"
    page = client.get(f"/admin/cyclone/runs/{run.id}").get_data(as_text=True)
    assert "actions allowed" in page
    token = csrf_token(page)
    with client.session_transaction() as session:
        session["role"] = "guest"
    denied = client.post(f"/admin/cyclone/runs/{run.id}/cancel", data={"csrf_token": token})
    assert denied.status_code == 403
    assert run.status().state == cyclone.RunState.RUNNING
    with client.session_transaction() as session:
        session["role"] = "operator"
    done = client.post(f"/admin/cyclone/runs/{run.id}/cancel", data={"csrf_token": token})
    assert done.status_code == 303
    assert run.status().state == cyclone.RunState.CANCELLED
    with app.app_context():
        db.engine.dispose()
