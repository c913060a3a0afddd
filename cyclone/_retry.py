"""Backoff between attempts of a step that raised: exponential, capped, with jitter (pure)."""

from __future__ import annotations

import random
from collections.abc import Callable

Backoff = Callable[[int], float]

DEFAULT_BASE = 1.0
DEFAULT_CAP = 300.0
DEFAULT_JITTER = 0.25


def exponential(
    base: float = DEFAULT_BASE,
    cap: float = DEFAULT_CAP,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> Backoff:
    """Seconds to wait after failed attempt ``n``: ``min(cap, base * 2**(n-1))`` +/- jitter."""

    def backoff(attempt: int) -> float:
        delay = min(cap, base * 2 ** max(0, attempt - 1))
        return float(max(0.0, delay * (1 + jitter * (2 * rand() - 1))))

    return backoff
