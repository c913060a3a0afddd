"""Key rules for submit and unique keys, checked before any database contact."""

from __future__ import annotations

from cyclone import errors

MAX_KEY_BYTES = 256


def check_key(key: object) -> str:
    """Return ``key`` if it is a valid key, else raise :class:`~cyclone.InvalidKeyError`."""
    if not isinstance(key, str):
        raise errors.InvalidKeyError(key=key, reason=f"must be a str, not {type(key).__name__}")
    if not key:
        raise errors.InvalidKeyError(key=key, reason="must not be empty")
    try:
        encoded = key.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidKeyError(key=key, reason="must be valid UTF-8") from None
    if b"\x00" in encoded:
        raise errors.InvalidKeyError(key=key, reason="must not contain NUL")
    if len(encoded) > MAX_KEY_BYTES:
        raise errors.InvalidKeyError(
            key=key, reason=f"is {len(encoded)} bytes, at most {MAX_KEY_BYTES} allowed"
        )
    return key


def unstorable(text: str) -> str | None:
    """Why PostgreSQL's text (and jsonb) cannot hold ``text``, or None when it can: a NUL,
    or a lone surrogate, which has no UTF-8."""
    if "\x00" in text:
        return "contains NUL, which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (it holds a lone surrogate)"
    return None
