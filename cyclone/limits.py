"""Flow control: ``Concurrency`` and ``Rate``, limits per key held across every worker.

Defining touches no database. A limit's key is evaluated on the decoded input when a job
is enqueued (or a run submitted) and stored with it; its name (given, or derived from the
definition) names one row of ``cyclone_limits`` that every definition with that name shares.
See docs/flow-control.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from cyclone import _keys, _timing, errors
from cyclone.schema import MAX_INTEGER

OnLimit = Literal["queue", "cancel_newest", "cancel_in_progress"]
ON_LIMIT: tuple[str, ...] = ("queue", "cancel_newest", "cancel_in_progress")

ALL_KEYS = ""
"""The key of a limit given no ``key=``: one group for everything it counts."""


def _check_name(name: object) -> str | None:
    if name is None:
        return None
    from cyclone.workflow import check_name

    return check_name("a limit name", name)


class Concurrency:
    """At most ``max`` at once, across every worker, per value of ``key(input)``.

    Given to a standalone step kind (``@cyclone.step(..., concurrency=)``) it counts the
    running attempts of its jobs; given to a workflow (``Workflow(..., concurrency=)``)
    it counts its runs in progress. Definitions whose ``name`` is the same share one
    limit.

    Args:
        max: how many at once per key (an int >= 1).
        key: ``key(input) -> str``, evaluated on the decoded input at enqueue or submit
            time and stored with the job or run; None: one group.
        name: the limit's name, shared by every definition that gives it; default: one
            limit per definition.
        on_limit: ``"queue"`` (wait, holding no worker, served fairly across keys),
            ``"cancel_newest"`` or ``"cancel_in_progress"`` (workflows only).
    """

    def __init__(
        self,
        max: int,
        *,
        key: Callable[[Any], str] | None = None,
        name: str | None = None,
        on_limit: OnLimit = "queue",
    ) -> None:
        if isinstance(max, bool) or not isinstance(max, int) or not 1 <= max <= MAX_INTEGER:
            raise errors.DefinitionError(
                f"Concurrency max must be an int from 1 to {MAX_INTEGER}, not {max!r}"
            )
        if key is not None and not callable(key):
            raise errors.DefinitionError("Concurrency key must be a function of the input")
        if on_limit not in ON_LIMIT:
            raise errors.DefinitionError(
                f"Concurrency on_limit must be one of {', '.join(ON_LIMIT)}, not {on_limit!r}"
            )
        self.max = max
        self.key = key
        self.name = _check_name(name)
        self.on_limit: OnLimit = on_limit

    def __repr__(self) -> str:
        return f"Concurrency({self.max}, name={self.name!r}, on_limit={self.on_limit!r})"


class Rate:
    """At most ``limit`` attempt starts per ``per``, across every worker, per key.

    Windows are fixed: each starts at a multiple of ``per`` since the Unix epoch, so at
    most ``limit`` attempts of a key start between two such instants.

    Args:
        limit: how many starts per window (an int >= 1).
        per: the window's length (a positive ``timedelta``).
        key: ``key(input) -> str`` as for :class:`Concurrency`; None: one group.
        name: shared by every definition that gives it.
    """

    def __init__(
        self,
        limit: int,
        per: timedelta,
        *,
        key: Callable[[Any], str] | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_INTEGER:
            raise errors.DefinitionError(
                f"Rate limit must be an int from 1 to {MAX_INTEGER}, not {limit!r}"
            )
        if not isinstance(per, timedelta) or per <= timedelta():
            raise errors.DefinitionError(f"Rate per must be a positive timedelta, not {per!r}")
        # A worker reads when the next window opens (a multiple of per since the epoch,
        # plus per): past 1,000 years that time fell after year 9999 and the read failed
        # in the driver at every idle loop, each failure logged with its traceback.
        if per > _timing.MAX_DURATION:
            raise errors.DefinitionError(
                f"Rate per is at most {_timing.MAX_DURATION.days} days (1,000 years), not {per!r}"
            )
        if key is not None and not callable(key):
            raise errors.DefinitionError("Rate key must be a function of the input")
        self.limit = limit
        self.per = per
        self.key = key
        self.name = _check_name(name)

    def __repr__(self) -> str:
        return f"Rate({self.limit}, {self.per!r}, name={self.name!r})"


@dataclass(frozen=True, slots=True)
class Spec:
    """A limit as a definition uses it: its resolved name and what it counts."""

    name: str
    max: int
    per: timedelta | None
    on_limit: str
    counts: str
    """``"attempts"`` (a kind's Concurrency), ``"runs"`` (a workflow's), ``"starts"`` (a Rate)."""
    key_fn: Callable[[Any], str] | None
    rate: Spec | None = None
    """A step's or step kind's Rate given with its Concurrency: it gates the same attempts,
    and the job keeps its name and key too (``rate_name``, ``rate_key``)."""

    def key_of(self, value: Any) -> str:
        """The key of ``value`` (the decoded input), checked: raises before anything is written."""
        if self.key_fn is None:
            return ALL_KEYS
        try:
            key = self.key_fn(value)
        except Exception as exc:
            raise errors.InputError(
                what=f"the key of limit {self.name!r}",
                reason=f"its function raised {type(exc).__name__}: {exc}",
            ) from exc
        _keys.check_key(key)
        return key


def resolve_pair(
    concurrency: Concurrency | None, rate: Rate | None, default_name: str
) -> Spec | None:
    """The :class:`Spec` of a step's or step kind's limits: its Concurrency carrying its
    Rate when both are given (the Rate named ``<default>.rate`` unless named)."""
    if concurrency is None or rate is None:
        return resolve(concurrency or rate, default_name, "attempts")
    paired = resolve(rate, f"{default_name}.rate", "starts")
    primary = resolve(concurrency, default_name, "attempts")
    assert primary is not None
    return Spec(
        name=primary.name,
        max=primary.max,
        per=None,
        on_limit=primary.on_limit,
        counts=primary.counts,
        key_fn=primary.key_fn,
        rate=paired,
    )


def resolve(
    given: Concurrency | Rate | None, default_name: str, counts_concurrency: str
) -> Spec | None:
    """The :class:`Spec` of ``given`` on a definition whose own limit is ``default_name``."""
    if given is None:
        return None
    if isinstance(given, Concurrency):
        return Spec(
            name=given.name or default_name,
            max=given.max,
            per=None,
            on_limit=given.on_limit,
            counts=counts_concurrency,
            key_fn=given.key,
        )
    if isinstance(given, Rate):
        return Spec(
            name=given.name or default_name,
            max=given.limit,
            per=given.per,
            on_limit="queue",
            counts="starts",
            key_fn=given.key,
        )
    raise errors.DefinitionError(f"expected a cyclone.Concurrency or cyclone.Rate, not {given!r}")
