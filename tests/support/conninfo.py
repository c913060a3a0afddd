"""What libpq says about a psycopg connection's parameters (``PQconninfo``)."""

from __future__ import annotations

from typing import Any

KEEPALIVE_PARAMETERS = (
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)


def keepalive_settings(driver: Any) -> dict[str, str | None]:
    """The effective keepalive parameters of an open psycopg connection (None: unset)."""
    return {
        option.keyword.decode(): None if option.val is None else option.val.decode()
        for option in driver.pgconn.info
        if option.keyword.decode() in KEEPALIVE_PARAMETERS
    }
