"""The exception hierarchy: every error cyclone raises on purpose, with structured attributes.

Constructors are keyword-only and build their own message; ``__reduce__`` keeps the
attributes intact when an error is pickled across a process boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class CycloneError(Exception):
    """Base class of every error cyclone raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.__dict__))


def _rebuild(cls: type[CycloneError], state: dict[str, Any]) -> CycloneError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    Exception.__init__(error, str(state.get("_message", "")))
    return error


class _Message(CycloneError):
    def __init__(self, message: str) -> None:
        self._message = message
        super().__init__(message)


class DefinitionError(_Message):
    """A workflow or step definition is invalid (cycle, unknown dependency, duplicate name...)."""


class InvalidKeyError(_Message, ValueError):
    """A submit or unique key breaks the key rules; raised before any database contact."""

    def __init__(self, *, key: object, reason: str) -> None:
        self.key = key
        self.reason = reason
        super().__init__(f"invalid key {key!r}: {reason}")


class InputError(_Message, TypeError):
    """An input, argument or output cannot be encoded as JSON or does not match its type."""

    def __init__(self, *, what: str, reason: str) -> None:
        self.what = what
        self.reason = reason
        super().__init__(f"{what}: {reason}")


class SubmitConflictError(_Message):
    """The key already belongs to a run of this workflow whose input is different.

    Also raised by ``wf.signal`` when the signal was sent already with another payload
    (then ``.signal`` names it).
    """

    def __init__(
        self, *, workflow: str, key: str, run_id: object, signal: str | None = None
    ) -> None:
        self.workflow = workflow
        self.key = key
        self.run_id = run_id
        self.signal = signal
        if signal is not None:
            super().__init__(
                f"signal {signal!r} was sent to run {run_id} (key {key!r} of workflow "
                f"{workflow!r}) already, with a different payload"
            )
            return
        super().__init__(
            f"key {key!r} of workflow {workflow!r} belongs to run {run_id} with a different input"
        )


class DuplicateError(_Message):
    """An active standalone job of this kind already holds the unique key."""

    def __init__(self, *, kind: str, key: str, job_id: int) -> None:
        self.kind = kind
        self.key = key
        self.job_id = job_id
        super().__init__(f"unique key {key!r} of step kind {kind!r} is held by active job {job_id}")


class NotFoundError(_Message, LookupError):
    """A run or job the handle points at no longer exists (it was purged)."""


class InvalidStateError(_Message):
    """An operation is not allowed in the current state (e.g. retry of a running run).

    ``what`` is ``"run"``, or ``"job"`` when ``run_id`` holds a standalone job's id.
    """

    def __init__(self, *, operation: str, run_id: object, state: str, what: str = "run") -> None:
        self.operation = operation
        self.run_id = run_id
        self.state = state
        self.what = what
        super().__init__(f"cannot {operation} {what} {run_id}: it is {state}")


class NoOutputError(_Message):
    """The run has no result node (for example, it was first submitted by a plain Workflow)."""

    def __init__(self, *, run_id: object, workflow: str) -> None:
        self.run_id = run_id
        self.workflow = workflow
        super().__init__(f"run {run_id} of workflow {workflow!r} has no result node")


class RunFailedError(_Message):
    """The run ended failed or cancelled, so it has no result."""

    def __init__(
        self,
        *,
        run_id: object,
        workflow: str,
        state: str,
        step: str | None,
        error: dict[str, Any] | None,
    ) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.state = state
        self.step = step
        self.error = error
        detail = ""
        if error:
            detail = f": {error.get('type', 'Error')}: {error.get('message', '')}"
        where = f" in step {step!r}" if step else ""
        super().__init__(f"run {run_id} of workflow {workflow!r} {state}{where}{detail}")


class SchemaError(_Message):
    """The database schema is missing or older than this version of cyclone expects."""


class TransactionAbortedError(_Message):
    """A ``_tx`` call got a connection whose transaction already failed; nothing was sent."""


class MissingExtraError(_Message, ModuleNotFoundError):
    """An optional integration was imported without a library its extra installs.

    Also a ``ModuleNotFoundError`` (``name`` and ``missing`` are the missing library's
    top-level package, the original error its ``__cause__``), so code that catches that
    keeps working.
    """

    def __init__(self, *, module: str, missing: str | None, extra: str) -> None:
        self.module = module
        self.missing = missing
        self.extra = extra
        super().__init__(
            f"{module} needs the {extra} extra (no module named {missing!r}): "
            f"pip install 'cyclone[{extra}]'"
        )
        self.name = missing

    @classmethod
    @contextlib.contextmanager
    def guard(cls, module: str, extra: str) -> Iterator[None]:
        """Raise this error for a third-party module the block fails to import (also when
        a module it imports raised one: the outer integration names its own extra)."""
        try:
            yield
        except ModuleNotFoundError as exc:
            package = None if exc.name is None else exc.name.partition(".")[0]
            if package is None or package == "cyclone":
                raise
            raise cls(module=module, missing=package, extra=extra) from exc
