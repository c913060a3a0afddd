"""The dashboard mounted the documented ways: Flask (dispatcher and helper) and Django (include)."""

from __future__ import annotations

import json
import os
import re
import sys
import uuid
from pathlib import Path

import flask
import pytest
import sqlalchemy as sa
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.engine import URL
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client

import cyclone
from cyclone.contrib.flask import Cyclone
from cyclone.dashboard import create_app
from cyclone.dashboard._embed import scoped_stylesheet
from cyclone.dashboard.flask import mount
from tests.conftest import own_database
from tests.support import processes
from tests.support.dashboard import Order, csrf_token, shop

ROOT = Path(__file__).resolve().parent.parent


def test_flask_dispatcher_middleware_serves_the_dashboard_under_a_prefix(
    engine: sa.Engine, name: str
) -> None:
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    app = flask.Flask(__name__)

    @app.get("/")
    def home() -> str:
        return "the shop"

    app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, {"/admin/cyclone": create_app(engine)}
    )
    client = app.test_client()
    assert client.get("/").get_data(as_text=True) == "the shop"
    page = client.get(f"/admin/cyclone/runs/{run.id}")
    assert page.status_code == 200
    assert 'href="/admin/cyclone/static/style.css"' in page.get_data(as_text=True)
    assert client.get("/admin/cyclone/static/style.css").status_code == 200


def test_flask_mount_helper_signs_forms_with_the_apps_secret_key(
    engine: sa.Engine, name: str
) -> None:
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    s.worker(engine).drain()
    app = flask.Flask(__name__)
    app.config["SECRET_KEY"] = "flask-secret"
    mount(app, engine, prefix="/ops", authorize=lambda environ: True)
    client = app.test_client()
    html = client.get(f"/ops/runs/{run.id}").get_data(as_text=True)
    assert f'action="/ops/runs/{run.id}/retry"' in html
    answer = client.post(f"/ops/runs/{run.id}/retry", data={"csrf_token": csrf_token(html)})
    assert answer.status_code == 303
    assert answer.headers["Location"] == f"/ops/runs/{run.id}?done=retry"
    assert run.status().state == cyclone.RunState.RUNNING
    with pytest.raises(ValueError, match="prefix must start with '/'"):
        mount(app, engine, prefix="ops/")
    # An AttributeError before ('startswith', 'config').
    with pytest.raises(TypeError, match="prefix must be a path"):
        mount(app, engine, prefix=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="mount takes the Flask application, not str"):
        mount("app", engine)


def test_flask_mount_takes_engine_for_of_a_flask_sqlalchemy_app_outside_any_context(
    database_url: URL, engine: sa.Engine, name: str
) -> None:
    """``cy.engine`` and ``db.engine`` need an application context at setup time;
    ``cy.engine_for(app)`` does not."""
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    app = flask.Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = database_url.render_as_string(hide_password=False)
    db = SQLAlchemy(app)
    cy = Cyclone(app)
    with pytest.raises(RuntimeError, match="application context"):
        mount(app, cy.engine)
    mount(app, cy.engine_for(app), prefix="/ops")
    page = app.test_client().get(f"/ops/runs/{run.id}")
    assert page.status_code == 200
    assert name in page.get_data(as_text=True)
    with app.app_context():
        assert cy.engine_for(app) is db.engine
        db.engine.dispose()


def test_run_sections_for_another_page_are_the_run_pages_own_without_actions(
    engine: sa.Engine, name: str
) -> None:
    s = shop(name, message="card <declined>")
    run, _ = s.workflow.submit_once(engine, "k", Order(1))
    s.worker(engine).drain()
    dashboard = create_app(engine, authorize=lambda environ: True)
    page = Client(dashboard).get(f"/runs/{run.id}").get_data(as_text=True)
    sections = dashboard.render_run_sections(run.id)
    assert sections is not None
    assert sections.strip() in page  # the very markup of the run page, cut from it
    assert '<svg class="dag"' in sections
    assert '<pre class="traceback">Traceback' in sections
    assert "card &lt;declined&gt;" in sections
    assert "<form" not in sections
    assert dashboard.render_run_sections(uuid.uuid4()) is None


def test_the_scoped_stylesheet_styles_only_inside_its_element() -> None:
    css = scoped_stylesheet("cyclone-embed")
    rules = re.findall(r"([^{}]+)\{[^{}]*\}", css)
    assert len(rules) > 40
    for selectors in rules:
        for selector in selectors.split(","):
            assert selector.strip().startswith(".cyclone-embed"), selector
    assert ".cyclone-embed svg.dag .node-failed rect" in css
    assert "--failed:" in css  # the colours, on the element instead of :root
    assert "header" not in css


@pytest.fixture
def django_database() -> URL:
    url = own_database("cyclone_django")
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    engine.dispose()
    return url


@pytest.mark.processes
def test_django_include_serves_staff_and_lets_them_act(django_database: URL, name: str) -> None:
    engine = sa.create_engine(django_database, poolclass=sa.NullPool)
    s = shop(name)
    run, _ = s.workflow.submit_once(engine, "k<b>", Order(1))
    s.worker(engine).drain()
    assert run.status().state == cyclone.RunState.FAILED

    done = processes.run(
        [
            sys.executable,
            "-m",
            "tests.support.django_dashboard",
            django_database.render_as_string(hide_password=False),
            str(run.id),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["anonymous"] == [302, "/login/?next=/ops/cyclone/"]
    assert out["clerk"] == 403
    status, overview = out["overview"]
    assert status == 200
    assert 'href="/ops/cyclone/runs"' in overview
    assert name in overview
    assert out["css"] == 200
    assert "k&lt;b&gt;" in out["run_page"]
    assert f'action="/ops/cyclone/runs/{run.id}/retry"' in out["run_page"]
    assert out["forged"] == 403
    assert out["retry"] == [303, f"/ops/cyclone/runs/{run.id}?done=retry"]
    assert run.status().state == cyclone.RunState.RUNNING
    engine.dispose()
