"""Drive the dashboard mounted in a minimal Django project, through Django's test client.

Run as ``python -m tests.support.django_dashboard DATABASE_URL RUN_ID``: it configures
settings in this process, takes its URLconf from the ``django-urls`` snippet of
docs/dashboard.md, migrates Django's auth tables, and prints one JSON object with what
each request answered.
"""

from __future__ import annotations

import json
import re
import sys

import django
from django.conf import settings
from sqlalchemy.engine import make_url


def main(url_text: str, run_id: str) -> None:
    url = make_url(url_text)
    settings.configure(
        DEBUG=False,
        SECRET_KEY="django-test-secret",
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF=__name__,
        INSTALLED_APPS=[
            "cyclone.contrib.django",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.middleware.csrf.CsrfViewMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
        ],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": url.database,
                "USER": url.username,
                "PASSWORD": url.password or "",
                "HOST": url.host,
                "PORT": str(url.port or 5432),
            }
        },
        LOGIN_URL="/login/",
        USE_TZ=True,
    )
    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client

    call_command("migrate", verbosity=0)
    staff = User.objects.create_user("ops", is_staff=True)
    clerk = User.objects.create_user("clerk")
    out: dict[str, object] = {}

    page = Client().get("/ops/cyclone/")
    out["anonymous"] = [page.status_code, page.get("Location")]
    as_clerk = Client()
    as_clerk.force_login(clerk)
    out["clerk"] = as_clerk.get("/ops/cyclone/").status_code

    client = Client(enforce_csrf_checks=True)
    client.force_login(staff)
    overview = client.get("/ops/cyclone/")
    out["overview"] = [overview.status_code, overview.content.decode()]
    out["css"] = client.get("/ops/cyclone/static/style.css").status_code
    run_page = client.get(f"/ops/cyclone/runs/{run_id}").content.decode()
    out["run_page"] = run_page
    token = re.search(r'name="csrf_token" value="([^"]+)"', run_page)
    forged = client.post(f"/ops/cyclone/runs/{run_id}/retry", {"csrf_token": "forged"})
    out["forged"] = forged.status_code
    retry = client.post(
        f"/ops/cyclone/runs/{run_id}/retry", {"csrf_token": token.group(1) if token else ""}
    )
    out["retry"] = [retry.status_code, retry.get("Location")]
    print(json.dumps(out))


def _urls() -> object:
    """The URLconf of docs/dashboard.md, as the docs show it."""
    from tests.support.docs import snippet

    namespace: dict[str, object] = {}
    exec(snippet("docs/dashboard.md", "django-urls"), namespace)
    return namespace["urlpatterns"]


def __getattr__(name: str) -> object:
    if name == "urlpatterns":
        return _urls()
    raise AttributeError(name)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
