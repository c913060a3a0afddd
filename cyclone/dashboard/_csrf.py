"""CSRF protection for the dashboard's POST forms: a signed double-submit cookie.

A browser gets a random nonce in an HttpOnly, SameSite=Strict cookie; every form carries
a token derived from it (HMAC with the application's secret). A POST is accepted only
when the form's token matches the one derived from the request's own cookie, which a
page on another origin can neither read nor set.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

COOKIE = "cyclone_csrf"
FIELD = "csrf_token"


def new_nonce() -> str:
    return secrets.token_urlsafe(32)


def token_for(nonce: str, secret: bytes) -> str:
    """The form token for a cookie nonce."""
    return hmac.new(secret, nonce.encode(), hashlib.sha256).hexdigest()


def is_valid(nonce: str | None, token: str | None, secret: bytes) -> bool:
    """True when ``token`` is the one derived from the request's cookie ``nonce``."""
    if not nonce or not token:
        return False
    return hmac.compare_digest(token_for(nonce, secret), token)
