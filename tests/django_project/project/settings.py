"""Settings of the test project: a shop whose orders start a cyclone workflow.

The database server comes from CYCLONE_DATABASE_URL (as for the rest of cyclone's tests);
the database NAME from SHOP_DATABASE_NAME, so each test run uses a throwaway one.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
USE_TZ = True
ROOT_URLCONF = "project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_server = make_url(
    os.environ.get("CYCLONE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
)
_database = {
    "ENGINE": "django.db.backends.postgresql",
    "NAME": os.environ.get("SHOP_DATABASE_NAME", "shop"),
    "USER": _server.username or "",
    "PASSWORD": _server.password or "",
    "HOST": _server.host or "",
    "PORT": str(_server.port or ""),
}

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "cyclone.contrib.django",
    "shop",
]

DATABASES = {
    "default": _database,
    # A second database with cyclone's schema, for connections["archive"].
    "archive": {**_database, "NAME": os.environ.get("SHOP_ARCHIVE_NAME", "shop_archive")},
    # The default database again, keeping its connections open, checked before each use.
    "persistent": {
        **_database,
        "CONN_MAX_AGE": None,
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"MIRROR": "default"},
    },
}

CYCLONE_DATABASE = "default"  # the alias `manage.py cyclone` and the worker use

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

STATIC_URL = "static/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
