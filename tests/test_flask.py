"""cyclone.contrib.flask and the example shop (examples/flask_app), through Flask's test client,
Flask's CLI runner and the ``flask`` command, against real PostgreSQL."""

from __future__ import annotations

import functools
import http.client
import os
import shlex
import signal
import subprocess
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import flask
import pytest
import sqlalchemy as sa
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.engine import URL
from werkzeug.serving import make_server

import cyclone
from cyclone.contrib.flask import ConfigurationError, Cyclone, database_url, load_definitions
from cyclone.schema import runs
from tests.conftest import wait_until
from tests.support import docs, processes
from tests.support.dashboard import csrf_token
from tests.support.workers import Background

ROOT = Path(__file__).resolve().parent.parent
SECRET_KEY = "flask-test-secret"
EXAMPLE = ROOT / "examples" / "flask_app"
sys.path.insert(0, str(EXAMPLE))

import webshop  # noqa: E402
from webshop.models import Order, Stock, db  # noqa: E402
from webshop.workflows import checkout  # noqa: E402


@pytest.fixture(scope="module")
def app(database_url: URL) -> Iterator[flask.Flask]:
    """The example shop on the test database, its own tables created."""
    app = webshop.create_app(
        {
            "SQLALCHEMY_DATABASE_URI": database_url.render_as_string(hide_password=False),
            "SECRET_KEY": SECRET_KEY,
        }
    )
    with app.app_context():
        db.create_all()
    yield app
    with app.app_context():
        cyclone.close(db.engine)
        db.engine.dispose()


@pytest.fixture
def item(app: flask.Flask) -> str:
    """An item of this test only, 10 in stock at 250 cents."""
    name = f"widget-{uuid.uuid4().hex[:8]}"
    with app.app_context():
        db.session.add(Stock(item=name, available=10, price_cents=250))
        db.session.commit()
    return name


def post_order(client: Any, key: str | None, item: str, quantity: int) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/orders", json={"item": item, "quantity": quantity}, headers=headers)


def runs_of_checkout(app: flask.Flask) -> list[tuple[str, uuid.UUID]]:
    with app.app_context(), db.engine.connect() as conn:
        return [
            (key, run_id)
            for key, run_id in conn.execute(
                sa.select(runs.c.submit_key, runs.c.id).where(runs.c.workflow == checkout.name)
            )
        ]


def orders_with_key(app: flask.Flask, key: str) -> list[Order]:
    with app.app_context():
        return list(db.session.scalars(sa.select(Order).filter_by(idempotency_key=key)))


def test_a_retried_post_returns_the_same_order_and_run(app: flask.Flask, item: str) -> None:
    client = app.test_client()
    key = str(uuid.uuid4())
    first = post_order(client, key, item, 2)
    retry = post_order(client, key, item, 2)
    assert first.status_code == 201
    assert retry.status_code == 200
    assert retry.get_json() == first.get_json()
    order_id, run_id = first.get_json()["order_id"], first.get_json()["run_id"]
    assert [o.id for o in orders_with_key(app, key)] == [order_id]
    assert [r for k, r in runs_of_checkout(app) if k == f"order:{order_id}"] == [uuid.UUID(run_id)]


def test_a_retry_with_another_body_is_refused_and_changes_nothing(
    app: flask.Flask, item: str
) -> None:
    client = app.test_client()
    key = str(uuid.uuid4())
    assert post_order(client, key, item, 2).status_code == 201
    before = runs_of_checkout(app)
    refused = post_order(client, key, item, 3)
    assert refused.status_code == 422
    assert runs_of_checkout(app) == before
    assert [o.quantity for o in orders_with_key(app, key)] == [2]


def test_a_post_without_idempotency_key_is_refused(app: flask.Flask, item: str) -> None:
    assert post_order(app.test_client(), None, item, 1).status_code == 400


def test_an_error_after_the_submit_leaves_neither_order_nor_run_and_frees_the_key(
    app: flask.Flask, item: str
) -> None:
    client = app.test_client()
    key = str(uuid.uuid4())
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    with app.app_context():
        engine = db.engine
    before = runs_of_checkout(app)
    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        response = post_order(client, key, item, 11)  # 10 in stock
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    assert response.status_code == 409
    # The run was inserted (then the stock update found too little and raised) ...
    inserts = [s for s in statements if s.lstrip().startswith(("INSERT", "WITH"))]
    assert any("cyclone_runs" in s for s in inserts)
    assert any("UPDATE webshop_stock" in s for s in statements)
    # ... and the request's transaction took both the order and the run with it.
    assert orders_with_key(app, key) == []
    assert runs_of_checkout(app) == before
    # The Idempotency-Key is free again: the retry makes the order and its run.
    retry = post_order(client, key, item, 10)
    assert retry.status_code == 201
    (order,) = orders_with_key(app, key)
    assert (f"order:{order.id}", uuid.UUID(retry.get_json()["run_id"])) in runs_of_checkout(app)


def flask_command(args: str, database_url: URL) -> subprocess.CompletedProcess[str]:
    """``flask ARGS`` as a shell would run it, in the example's folder."""
    return processes.run(
        [sys.executable, "-m", "flask", *shlex.split(args)],
        cwd=EXAMPLE,
        env=flask_env(database_url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.processes
def test_the_worker_command_runs_the_run_and_its_steps_use_db_session(
    app: flask.Flask, item: str, database_url: URL
) -> None:
    client = app.test_client()
    created = post_order(client, str(uuid.uuid4()), item, 3)
    assert created.status_code == 201
    order_id = created.get_json()["order_id"]
    pending = client.get(f"/orders/{order_id}").get_json()
    assert pending["run"]["state"] == "running"
    assert pending["status"] == "pending"
    assert pending["result"] is None

    done = flask_command("--app webshop cyclone worker --drain", database_url)
    assert done.returncode == 0, done.stderr
    assert "ran " in done.stdout

    shown = client.get(f"/orders/{order_id}").get_json()
    assert shown["run"] == {"id": created.get_json()["run_id"], "state": "completed", "error": None}
    # The steps read the stock and wrote the order through db.session.
    assert shown["status"] == "confirmed"
    assert shown["result"] == {"order_id": order_id, "amount_cents": 750, "status": "confirmed"}


def test_steps_run_in_the_app_context_and_their_session_is_removed_after_each(
    app: flask.Flask, name: str
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    seen: list[tuple[bool, Any]] = []

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> int:
        seen.append((flask.current_app.name == app.name, db.session()))
        return int(db.session.execute(sa.select(sa.literal(1))).scalar_one())  # no commit

    @wf.step(after=[first])
    def second(ctx: cyclone.StepContext, value: Any) -> int:
        seen.append((flask.current_app.name == app.name, db.session()))
        return int(db.session.execute(sa.select(sa.literal(2))).scalar_one())

    cy: Cyclone = app.extensions["cyclone"]
    with app.app_context():
        engine = db.engine
    wf.submit(engine, None)
    with cy.worker(app, workflows=[wf]) as worker:
        assert worker.drain() == 2
    assert [in_app for in_app, _ in seen] == [True, True]
    assert seen[0][1] is not seen[1][1]  # a session per step
    assert not any(session.in_transaction() for _, session in seen)
    # Each step left its session inside a transaction; the app context's teardown
    # removed the session, which gave its connection back.
    assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]


def test_the_worker_uses_the_app_engine_and_config_modules(app: flask.Flask) -> None:
    cy: Cyclone = app.extensions["cyclone"]
    with app.app_context():
        assert cy.engine is db.engine
        worker = cy.worker()
    assert set(worker.workflows) == {checkout.name}
    assert worker.step_context is not None
    worker.close()


def bare_app(**config: Any) -> flask.Flask:
    app = flask.Flask(f"bare{uuid.uuid4().hex[:6]}")
    app.config.update(config)
    Cyclone(app)
    return app


def test_an_app_without_a_database_is_a_clear_error() -> None:
    app = bare_app()
    with pytest.raises(ConfigurationError, match="CYCLONE_DATABASE_URL"):
        app.extensions["cyclone"].engine_for(app)
    result = app.test_cli_runner().invoke(args=["cyclone", "runs", "list"])
    assert result.exit_code == 1
    assert result.stderr == (
        f"cyclone: Flask app {app.name!r} has no database for cyclone: set "
        "CYCLONE_DATABASE_URL, or initialise Flask-SQLAlchemy on the app\n"
    )


def test_a_worker_command_without_modules_is_a_clear_error(database_url: URL) -> None:
    app = bare_app(CYCLONE_DATABASE_URL=database_url.render_as_string(hide_password=False))
    result = app.test_cli_runner().invoke(args=["cyclone", "worker", "--drain"])
    assert result.exit_code == 1
    assert result.stderr.startswith(
        f"cyclone: Flask app {app.name!r} sets no CYCLONE_WORKER_MODULES"
    )
    assert len(result.stderr.splitlines()) == 1
    app.extensions["cyclone"].engine_for(app).dispose()


def test_config_url_without_driver_gets_psycopg(database_url: URL) -> None:
    plain = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    app = bare_app(CYCLONE_DATABASE_URL=plain)
    engine = app.extensions["cyclone"].engine_for(app)
    try:
        assert engine.url.drivername == "postgresql+psycopg"
        assert engine is app.extensions["cyclone"].engine_for(app)
        with engine.connect() as conn:
            assert conn.execute(sa.select(sa.literal(1))).scalar_one() == 1
    finally:
        engine.dispose()
    assert database_url_of("postgres://u@h/d") == "postgresql+psycopg://u@h/d"


def database_url_of(url: str) -> str:
    return database_url(url).render_as_string(hide_password=False)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u@h/d", "cyclone needs PostgreSQL"),
        ("postgresql+psycopg2://u@h/d", "needs the psycopg 3 driver"),
        ("not a url", "is not a database URL"),
    ],
)
def test_config_urls_cyclone_cannot_use_are_clear_errors(url: str, message: str) -> None:
    app = bare_app(CYCLONE_DATABASE_URL=url)
    with pytest.raises(ConfigurationError, match=message):
        app.extensions["cyclone"].engine_for(app)


def test_an_unknown_sqlalchemy_bind_is_a_clear_error(database_url: URL) -> None:
    app = flask.Flask("binds")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url.render_as_string(hide_password=False),
        CYCLONE_SQLALCHEMY_BIND="reports",
    )
    SQLAlchemy(app)
    cy = Cyclone(app)
    with pytest.raises(ConfigurationError, match="'reports'"):
        cy.engine_for(app)


def test_worker_modules_that_define_nothing_or_do_not_import_are_clear_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"'json' .* defines no cyclone workflow"):
        load_definitions(["json"])
    with pytest.raises(ConfigurationError, match="'no_such_module_x'"):
        load_definitions(["no_such_module_x"])
    app = bare_app()
    with pytest.raises(ConfigurationError, match="sets no CYCLONE_WORKER_MODULES"):
        app.extensions["cyclone"].definitions_for(app)


def test_the_extension_is_needed_before_use() -> None:
    app = flask.Flask("plain")
    with pytest.raises(ConfigurationError, match="not initialised"):
        Cyclone().engine_for(app)


# -- docs/flask.md -----------------------------------------------------------------------


def example_sources() -> str:
    return "\n".join(p.read_text() for p in sorted((EXAMPLE / "webshop").glob("*.py")))


def test_every_python_snippet_of_the_flask_doc_is_code_of_the_example() -> None:
    """The python blocks of docs/flask.md are excerpts of examples/flask_app, which the tests
    above run; none is written for the page alone."""
    sources = example_sources()
    snippets = docs.all_blocks("docs/flask.md", "python")
    assert snippets
    for snippet in snippets:
        assert snippet in sources, snippet


def flask_env(database_url: URL) -> dict[str, str]:
    env = {
        **os.environ,
        "WEBSHOP_DATABASE_URL": database_url.render_as_string(hide_password=False),
    }
    env.pop("CYCLONE_DATABASE_URL", None)
    return env


@pytest.mark.processes
def test_the_flask_doc_commands_run_as_written(
    app: flask.Flask, item: str, database_url: URL
) -> None:
    """Each ``$ flask ...`` line of docs/flask.md, run in the example's folder; the worker
    that runs until stopped runs an order's checkout, then stops on SIGTERM."""
    commands = [
        line.removeprefix("$ flask ")
        for block in docs.all_blocks("docs/flask.md", "console")
        for line in block.splitlines()
        if line.startswith("$ flask ")
    ]
    assert any("cyclone worker --drain" in c for c in commands)
    serving = [c for c in commands if " worker" in c and "--drain" not in c]
    assert serving
    for args in commands:
        if args in serving:
            continue
        done = flask_command(args, database_url)
        assert done.returncode == 0, f"flask {args}\n{done.stdout}\n{done.stderr}"
    client = app.test_client()
    for args in serving:
        worker = processes.popen(
            [sys.executable, "-m", "flask", *shlex.split(args)],
            cwd=EXAMPLE,
            env=flask_env(database_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            order_id = post_order(client, str(uuid.uuid4()), item, 1).get_json()["order_id"]
            url = f"/orders/{order_id}"
            wait_until(lambda u=url: client.get(u).get_json()["status"] == "confirmed", timeout=30)
        finally:
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err


def test_a_retry_sent_while_the_first_post_is_in_flight_waits_and_returns_its_run(
    app: flask.Flask, item: str
) -> None:
    key = str(uuid.uuid4())
    with app.app_context():
        engine = db.engine
    first_reserving = threading.Event()
    release = threading.Event()

    def hold_first(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith("UPDATE webshop_stock"):
            first_reserving.set()
            assert release.wait(30)

    sa.event.listen(engine, "before_cursor_execute", hold_first)
    try:
        first = Background(lambda: post_order(app.test_client(), key, item, 2))
        assert first_reserving.wait(30)  # the first try submitted and has not committed
        retry = Background(lambda: post_order(app.test_client(), key, item, 2))

        def retry_waits_for_the_first() -> bool:
            with engine.connect() as conn:
                return bool(
                    conn.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND wait_event_type = 'Lock' "
                            "AND query LIKE 'INSERT INTO webshop_orders%'"
                        )
                    ).scalar_one()
                )

        wait_until(retry_waits_for_the_first)
        release.set()
        first_response, retry_response = first.join(), retry.join()
    finally:
        release.set()
        sa.event.remove(engine, "before_cursor_execute", hold_first)
    assert first_response.status_code == 201
    assert retry_response.status_code == 200
    assert retry_response.get_json() == first_response.get_json()
    assert len(orders_with_key(app, key)) == 1


def test_a_flask_sqlalchemy_engine_without_psycopg_3_is_a_clear_error() -> None:
    app = flask.Flask("otherdriver")
    app.config["SQLALCHEMY_DATABASE_URI"] = "sqlite://"  # never connected: refused first
    SQLAlchemy(app)
    cy = Cyclone(app)
    with pytest.raises(ConfigurationError, match=r"needs PostgreSQL with psycopg 3.*sqlite"):
        cy.engine_for(app)


def test_one_extension_serves_several_apps_each_with_its_own_engine(database_url: URL) -> None:
    cy = Cyclone()
    first, second = flask.Flask("first"), flask.Flask("second")
    plain = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    first.config["CYCLONE_DATABASE_URL"] = plain
    second.config["CYCLONE_DATABASE_URL"] = plain
    cy.init_app(first)
    cy.init_app(second)
    assert first.extensions["cyclone"] is cy
    assert second.extensions["cyclone"] is cy
    engines = [cy.engine_for(first), cy.engine_for(second)]
    try:
        assert engines[0] is not engines[1]
        with second.app_context():
            assert cy.engine is engines[1]
    finally:
        for engine in engines:
            engine.dispose()


# -- the dashboard, mounted by the extension ----------------------------------------------


def as_role(client: Any, role: str | None) -> None:
    """Log the test client in as the example's login would: a role in the session."""
    with client.session_transaction() as session:
        session.pop("role", None)
        if role is not None:
            session["role"] = role


def run_state(app: flask.Flask, run_id: str) -> cyclone.RunState:
    with app.app_context():
        status = cyclone.Client(db.engine).get_run(uuid.UUID(run_id))
    assert status is not None
    return status.state


def test_the_dashboard_is_served_at_its_path_on_flask_sqlalchemys_engine(
    app: flask.Flask, item: str
) -> None:
    """``Cyclone(dashboard="/cyclone")`` runs at import time, outside any app context; the
    engine, Flask-SQLAlchemy's, is taken at the first request."""
    client = app.test_client()
    run_id = post_order(client, str(uuid.uuid4()), item, 1).get_json()["run_id"]
    overview = client.get("/cyclone/")
    assert overview.status_code == 200
    assert 'href="/cyclone/runs"' in overview.get_data(as_text=True)
    page = client.get(f"/cyclone/runs/{run_id}").get_data(as_text=True)
    assert checkout.name in page
    assert 'href="/cyclone/static/style.css"' in page
    assert client.get("/cyclone/static/style.css").status_code == 200
    assert client.get("/cyclone").status_code == 308  # to /cyclone/, as Flask does
    with app.test_request_context():
        assert flask.url_for("cyclone_dashboard.page", subpath="runs") == "/cyclone/runs"
    assert client.get("/orders/no-such-page").status_code == 404  # the app's own routes


def test_authorize_reads_flask_session_and_a_denied_action_gets_403(
    app: flask.Flask, item: str
) -> None:
    client = app.test_client()
    run_id = post_order(client, str(uuid.uuid4()), item, 1).get_json()["run_id"]
    anonymous = client.get(f"/cyclone/runs/{run_id}").get_data(as_text=True)
    assert "read-only" in anonymous
    assert 'method="post"' not in anonymous

    as_role(client, "operator")
    page = client.get(f"/cyclone/runs/{run_id}").get_data(as_text=True)
    assert "actions allowed" in page
    assert f'action="/cyclone/runs/{run_id}/cancel"' in page
    token = csrf_token(page)

    as_role(client, "clerk")  # a valid form, from a user authorize refuses
    denied = client.post(f"/cyclone/runs/{run_id}/cancel", data={"csrf_token": token})
    assert denied.status_code == 403
    assert "read-only for you" in denied.get_data(as_text=True)
    assert run_state(app, run_id) == cyclone.RunState.RUNNING

    as_role(client, "operator")
    done = client.post(f"/cyclone/runs/{run_id}/cancel", data={"csrf_token": token})
    assert done.status_code == 303
    assert done.headers["Location"] == f"/cyclone/runs/{run_id}?done=cancel"
    assert run_state(app, run_id) == cyclone.RunState.CANCELLED


def test_the_factory_pattern_mounts_per_app_and_authorize_runs_in_the_request_context(
    database_url: URL,
) -> None:
    seen: list[tuple[str, str, Any]] = []

    def authorize(request: flask.Request) -> bool:
        seen.append((request.path, flask.request.path, flask.g.user))
        return bool(flask.g.user == "ops")

    def login_required(view: Any) -> Any:
        @functools.wraps(view)
        def wrapped(**kwargs: Any) -> Any:
            if flask.g.user is None:
                flask.abort(401)
            return view(**kwargs)

        return wrapped

    db_ext = SQLAlchemy()
    cy = Cyclone(
        dashboard="/ops/cyclone", authorize=authorize, dashboard_decorators=[login_required]
    )

    def create_app(**options: Any) -> flask.Flask:
        app = flask.Flask(f"factory{uuid.uuid4().hex[:6]}")
        app.config.update(
            SQLALCHEMY_DATABASE_URI=database_url.render_as_string(hide_password=False),
            SECRET_KEY=SECRET_KEY,
            CYCLONE_DASHBOARD_TITLE="factory ops",
        )
        db_ext.init_app(app)

        @app.before_request
        def load_user() -> None:
            flask.g.user = flask.session.get("user")

        cy.init_app(app, **options)
        return app

    first, second, third = (
        create_app(),
        create_app(dashboard="/admin/jobs"),
        create_app(dashboard=None),
    )
    try:
        client = first.test_client()
        assert client.get("/ops/cyclone/").status_code == 401  # the decorator, before authorize
        assert seen == []
        with client.session_transaction() as session:
            session["user"] = "ops"
        page = client.get("/ops/cyclone/runs")
        assert page.status_code == 200
        assert "actions allowed" in page.get_data(as_text=True)
        assert "factory ops" in page.get_data(as_text=True)
        assert seen == [("/ops/cyclone/runs", "/ops/cyclone/runs", "ops")]
        with client.session_transaction() as session:
            session["user"] = "viewer"
        assert "read-only" in client.get("/ops/cyclone/").get_data(as_text=True)

        other = second.test_client()
        with other.session_transaction() as session:
            session["user"] = "ops"
        assert other.get("/admin/jobs/jobs").status_code == 200
        assert other.get("/ops/cyclone/").status_code == 404
        assert third.test_client().get("/ops/cyclone/").status_code == 404
        with pytest.raises(ValueError, match="dashboard must be a path"):
            cy.init_app(flask.Flask("bad"), dashboard="ops/")
        # An int was an AttributeError ('startswith'); a non-callable authorize failed
        # every dashboard request with a 500.
        with pytest.raises(TypeError, match="dashboard must be a path"):
            cy.init_app(flask.Flask("bad"), dashboard=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="authorize must be callable or None, not str"):
            Cyclone(flask.Flask("bad"), dashboard="/ops", authorize="ops")  # type: ignore[arg-type]
        # Not the application: an AttributeError ('config') before.
        with pytest.raises(TypeError, match="init_app takes the Flask application, not int"):
            Cyclone(5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="init_app takes the Flask application, not NoneType"):
            cy.init_app(None)  # type: ignore[arg-type]
    finally:
        for app in (first, second, third):
            with app.app_context():
                db_ext.engine.dispose()


@pytest.mark.processes
def test_flask_cyclone_help_says_the_database_is_the_apps(database_url: URL) -> None:
    done = flask_command("--app webshop cyclone --help", database_url)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "The database is the Flask app's: the CYCLONE_DATABASE_URL of its config" in said
    assert "else Flask-SQLAlchemy's engine" in said
    assert "$CYCLONE_DATABASE_URL" not in said
    listing = flask_command("--app webshop cyclone runs list --help", database_url)
    assert "Use this database instead of the application's." in " ".join(listing.stdout.split())


def test_the_dashboard_answers_through_a_real_server_with_the_session_cookie(
    app: flask.Flask, item: str
) -> None:
    """Over HTTP, as a browser: the session cookie Flask signed reaches ``authorize``."""
    run_id = post_order(app.test_client(), str(uuid.uuid4()), item, 1).get_json()["run_id"]
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    signed = app.session_interface.get_signing_serializer(app)  # type: ignore[attr-defined]
    session = signed.dumps({"role": "operator"})

    def fetch(path: str, cookies: dict[str, str], form: dict[str, str] | None = None) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=30)
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request("GET" if form is None else "POST", path, body, headers)
        answer = connection.getresponse()
        answer.text = answer.read().decode()
        connection.close()
        return answer

    try:
        guest = fetch(f"/cyclone/runs/{run_id}", {})
        assert guest.status == 200
        assert "read-only" in guest.text
        page = fetch(f"/cyclone/runs/{run_id}", {"session": session})
        assert "actions allowed" in page.text
        nonce = SimpleCookie(page.getheader("Set-Cookie"))["cyclone_csrf"].value
        form = {"csrf_token": csrf_token(page.text)}
        denied = fetch(f"/cyclone/runs/{run_id}/cancel", {"cyclone_csrf": nonce}, form)
        assert denied.status == 403
        assert run_state(app, run_id) == cyclone.RunState.RUNNING
        done = fetch(
            f"/cyclone/runs/{run_id}/cancel", {"session": session, "cyclone_csrf": nonce}, form
        )
        assert done.status == 303
        assert done.getheader("Location") == f"/cyclone/runs/{run_id}?done=cancel"
        assert run_state(app, run_id) == cyclone.RunState.CANCELLED
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()
