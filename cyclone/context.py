"""``StepContext``: what a running step sees (its run, attempt, input, upstream outputs)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine

from cyclone import _codec
from cyclone._store import rescue as _rescue

if TYPE_CHECKING:
    from cyclone.workflow import Step

R = TypeVar("R")


class StepContext:
    """Passed as the first argument of every step function."""

    def __init__(
        self,
        *,
        engine: Engine,
        job_id: int,
        run_id: uuid.UUID | None,
        workflow: str | None,
        step: str,
        attempt: int,
        max_attempts: int,
        input: Any,
        deadline: datetime | None,
        upstream: dict[str, Any],
        lease: int | None = None,
    ) -> None:
        self._engine = engine
        self.job_id = job_id
        self.run_id = run_id
        self.workflow = workflow
        self.step = step
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.input = input
        self.deadline = deadline
        self._upstream = upstream
        self._lease = lease

    def __repr__(self) -> str:
        return (
            f"<StepContext {self.workflow or 'job'}.{self.step} run={self.run_id} "
            f"attempt={self.attempt}/{self.max_attempts}>"
        )

    def output(self, step: Step[R]) -> R:
        """The output of an upstream step of this run, decoded to that step's return type.

        Raises:
            TypeError: ``step`` is not a step (its name, say: pass the decorated step).
            KeyError: ``step`` is not one this step comes after.
        """
        name = getattr(step, "name", None)
        if not isinstance(name, str) or not hasattr(step, "output_type"):
            raise TypeError(
                f"ctx.output takes an upstream step (the decorated function), "
                f"not {type(step).__name__}: ctx.output({step!r}) in step {self.step!r}"
            )
        if name not in self._upstream:
            raise KeyError(
                f"step {self.step!r} does not come after {name!r}; "
                f"its upstream steps are {sorted(self._upstream)}"
            )
        raw = self._upstream[name]
        value: R = _codec.decode(raw, step.output_type)
        return value

    @property
    def deadline_passed(self) -> bool:
        """True once the run's deadline (if any) has passed."""
        return self.deadline is not None and datetime.now(UTC) >= self.deadline

    def cancelled(self) -> bool:
        """True when the run was cancelled or failed, or this job is no longer ours to finish.

        The job is ours while it is running under the lease this execution was claimed
        with: once it is rescued, handed back or retried, the lease has moved on and any
        outcome of this execution would be refused. One query; long steps can call it
        between chunks of work and return early.
        """
        return _rescue.execution_ended(self._engine, self.run_id, self.job_id, self._lease)
