"""Backoff, written once: between attempts of a step that raised (exponential, capped, with
jitter), and before trying the database again (the same doubling, without jitter). Pure."""

from __future__ import annotations

import random
from collections.abc import Callable

Backoff = Callable[[int], float]

DEFAULT_BASE = 1.0
DEFAULT_CAP = 300.0
DEFAULT_JITTER = 0.25
_MAX_DOUBLINGS = 1000


def doubling(first: float, cap: float, failures: int) -> float:
    """Seconds to wait after ``failures`` failures in a row: ``min(cap, first * 2**(failures-1))``.

    The delay after the first failure is ``first``; it doubles with each further one, up
    to ``cap``. Used as it is by the loops that try the database again (a worker's claim,
    the maintenance leader, a wait's read), and with jitter by :func:`exponential`.
    """
    # The exponent is bounded: 2 ** 1024 no longer converts to a float, and the
    # OverflowError killed the caller (a step's 1,025th failure left its job claimed).
    return float(min(cap, first * 2.0 ** min(max(0, failures - 1), _MAX_DOUBLINGS)))


def exponential(
    base: float = DEFAULT_BASE,
    cap: float = DEFAULT_CAP,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> Backoff:
    """Seconds to wait after failed attempt ``n``: ``min(cap, base * 2**(n-1))`` +/- jitter."""

    def backoff(attempt: int) -> float:
        delay = doubling(base, cap, attempt)
        return float(max(0.0, delay * (1 + jitter * (2 * rand() - 1))))

    return backoff
