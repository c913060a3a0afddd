"""Run handles: ``Run`` and ``ResultRun`` (status, wait, result, cancel, retry, retention).

Handles hold the Engine and open short transactions of their own; cancel and retry are
:mod:`cyclone._store.control`'s. Waiting is woken by
``NOTIFY cyclone_run_finished`` and falls back to a slow poll.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from cyclone._graph import GraphSnapshot

import psycopg
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from cyclone import _codec, _retry, _timing, errors
from cyclone._store import control as _control
from cyclone._store import deadline as _deadline
from cyclone._store import executor as _executor
from cyclone._store import fork as _fork
from cyclone._store import notify as _notify
from cyclone._store import reads as _reads
from cyclone._store import waits as _waits
from cyclone.states import TERMINAL_RUN_STATES, Parked, RunState

Out = TypeVar("Out")
T = TypeVar("T")

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 5.0
RECONNECT_FIRST_PAUSE = 0.05
RECONNECT_MAX_PAUSE = 1.0
_SHUTDOWN_STATES = frozenset({"57P01", "57P02", "57P03"})


class Named(Protocol):
    """Anything with a ``name``: a step of a workflow."""

    @property
    def name(self) -> str: ...


class Definition(Protocol):
    """What a handle needs of the Workflow it came from (to fork a run onto it)."""

    def graph(self) -> GraphSnapshot: ...

    def _handle_of(self, engine: Engine, run_id: uuid.UUID, key: str | None) -> Run: ...


@dataclass(frozen=True, slots=True)
class RunStatus:
    """A snapshot of one run, as read from ``cyclone_runs``."""

    id: uuid.UUID
    workflow: str
    key: str | None
    state: RunState
    created_at: datetime
    finished_at: datetime | None
    """When the run reached a terminal state; None while it runs."""
    deadline: datetime | None
    error: dict[str, Any] | None
    failed_step: str | None
    retention: timedelta | None
    """How long the run is kept after ``finished_at``; None: the default, ``Worker(retention=)``."""
    forked_from: uuid.UUID | None = None
    """The run this one was forked from (:meth:`Run.fork`), which may since have been
    purged; None for a run that is not a fork."""
    parked: Parked | None = None
    """Why a running run waits with none of its steps running or due: ``WAITING`` for a
    signal, ``SLEEPING`` until a sleep node's time, ``DELAYED`` until its ``run_at``; None
    otherwise (its state stays ``RUNNING`` while parked)."""
    parent_id: uuid.UUID | None = None
    """The run whose child node (``@wf.child``) submitted this run; None for any other run."""
    parent_node: str | None = None
    """The name of that child node in the parent run's workflow."""
    parent_item: int | None = None
    """The index of the item of that node that submitted this run, when the node is a map
    of children (``@wf.child(workflow, over=node)``); None otherwise."""

    @property
    def done(self) -> bool:
        """True once the run is completed, failed or cancelled."""
        return self.state in TERMINAL_RUN_STATES

    @property
    def cursor(self) -> str:
        """This run's place in the listings, as text: pass it as ``after=`` to
        ``Client.list_runs`` (or ``cyclone runs list --after``) for the runs after it."""
        return f"{self.created_at.isoformat()}~{self.id}"


def lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection failed (server restarting or gone, backend
    terminated), not that the statement did: a read can simply be tried again.

    That is a connection SQLAlchemy invalidated, or a driver error with no SQLSTATE
    (the client saw the connection fail), of class 08 (connection exception), or
    57P01-57P03 (shutdown, crash, not accepting connections yet). A cancelled statement
    (57014, ``statement_timeout``) is not.
    """
    orig: BaseException | None = exc
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        orig = exc.orig
    if not isinstance(orig, (psycopg.OperationalError, psycopg.InterfaceError)):
        return False
    state = orig.sqlstate
    return state is None or state.startswith("08") or state in _SHUTDOWN_STATES


def read_within(read: Callable[[], T], deadline: float | None, what: str) -> T:
    """``read()`` bounded by ``deadline`` (monotonic), tried again after a lost connection.

    Raises TimeoutError once the deadline has passed, whether the read is blocked (a
    frozen network) or keeps failing to connect (a server still restarting).
    """
    failures = 0
    while True:
        try:
            return _deadline.call(read, deadline)
        except TimeoutError:
            raise TimeoutError(f"{what} did not finish in time") from None
        except Exception as exc:
            if not lost_connection(exc):
                raise
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{what} did not finish in time: {exc}") from exc
            log.info("cyclone lost its connection while reading %s (%s); reading again", what, exc)
            failures += 1
            pause = _retry.doubling(RECONNECT_FIRST_PAUSE, RECONNECT_MAX_PAUSE, failures)
            time.sleep(pause if left is None else min(pause, left))


def deadline_of(timeout: object) -> float | None:
    """The monotonic deadline of a wait's ``timeout`` (seconds; None: no deadline).

    A timeout that is not a number is a TypeError, a negative or NaN one a ValueError,
    before any statement: ``"5"`` failed in the arithmetic, NaN waited for ever. One of
    ``threading.TIMEOUT_MAX`` (292 years) or more, ``float("inf")`` included, is no
    deadline: a thread's wait that long failed with OverflowError, even on a finished run.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout= takes seconds (a number), not {type(timeout).__name__}")
    if not timeout >= 0:
        raise ValueError(f"timeout= takes a number of seconds >= 0, not {timeout!r}")
    if timeout >= threading.TIMEOUT_MAX:
        return None
    return time.monotonic() + timeout


def wait_until_finished(
    engine: Engine,
    token: str,
    timeout: float | None,
    read: Callable[[], T | None],
    started: float | None = None,
) -> T:
    """Call ``read()`` until it returns non-None, woken by notifications carrying ``token``.

    ``token`` is a run id, or ``job:<id>`` for a standalone job. ``started`` is when this
    process began the statement that created it: if the listener has listened since
    then and cannot have missed ``token`` finishing, the first read is skipped (it would
    find the run unfinished) and the wait begins at once. The poll fallback still
    applies, and a timeout is raised only after at least one read was tried. Each read
    is bounded by the time left (see :func:`read_within`), so the wait ends by its
    deadline even when the network to the server is frozen (a read that follows a wait
    may take :data:`cyclone._store.deadline.MIN_READ_WINDOW` past it).

    With a timeout the reads run on a helper thread; the wait before a read runs there
    too, so that the notification wakes the thread that reads, not the caller, which
    would then only hand the read over.
    """
    deadline = deadline_of(timeout)
    if deadline is not None:
        _deadline.interruptible(engine)
    woken = threading.Event()
    wanted = token

    def on_finished(payload: str) -> None:
        if payload in (wanted, ""):
            woken.set()

    awaiting = False

    def wait_then_read() -> T | None:
        nonlocal awaiting
        if awaiting:  # once: a read tried again after a lost connection does not wait
            awaiting = False
            left = DEFAULT_POLL_INTERVAL
            if deadline is not None:
                left = min(left, deadline - time.monotonic())
            if left > 0:
                woken.wait(left)
        woken.clear()
        return read()

    listener = _notify.listener(engine)
    unsubscribe = listener.subscribe(_notify.RUN_FINISHED, on_finished)
    try:
        listener.wait_ready(1.0 if timeout is None else min(1.0, timeout))
        awaiting = started is not None and listener.surely_unfinished(token, started)
        while True:
            # A read after a wait that lasted to the deadline still gets its window.
            within = deadline
            if awaiting and deadline is not None:
                within = max(deadline, time.monotonic()) + _deadline.MIN_READ_WINDOW
            try:
                value = read_within(wait_then_read, within, token)
            except TimeoutError:
                raise TimeoutError(f"{token} did not finish within {timeout} s") from None
            if value is not None:
                return value
            awaiting = True
            if deadline is not None and deadline - time.monotonic() <= 0:
                raise TimeoutError(f"{token} did not finish within {timeout} s")
    finally:
        unsubscribe()


class Run:
    """A handle on one run. Reading it opens short transactions on the handle's Engine."""

    def __init__(
        self,
        engine: Engine,
        run_id: uuid.UUID,
        workflow: str,
        key: str | None = None,
        *,
        started: float | None = None,
        signal_types: Mapping[str, Any] | None = None,
        definition: Definition | None = None,
    ) -> None:
        self._engine = engine
        self.id = run_id
        self.workflow = workflow
        self.key = key
        self._started = started
        self._signal_types = signal_types
        self._definition = definition

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} workflow={self.workflow!r} key={self.key!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def status(self) -> RunStatus:
        """The run's current status.

        Raises:
            NotFoundError: the run was purged, or the submitting transaction did not commit.
        """
        fields = _reads.run_status_now(self._engine, self.id)
        if fields is None:
            raise errors.NotFoundError(f"run {self.id} does not exist (purged, or not committed)")
        return RunStatus(*fields)

    def children(self) -> list[Run]:
        """The handles of the runs this run's child nodes submitted (``@wf.child``): node by
        node, in the order the nodes made their first child, and a map of children's in
        item order; typed as their workflow's handles when this handle's definition names it."""
        nodes: Mapping[str, Any] = getattr(self._definition, "steps", None) or {}
        found: list[Run] = []
        for run_id, workflow, key, node in _reads.children(self._engine, self.id):
            child = getattr(nodes.get(node), "child", None)
            if child is not None and child.name == workflow:
                found.append(child._handle_of(self._engine, run_id, key))
            else:
                found.append(Run(self._engine, run_id, workflow, key))
        return found

    def wait(self, timeout: float | None = None) -> RunStatus:
        """Wait until the run is completed, failed or cancelled; return its status.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """

        def read() -> RunStatus | None:
            status = self.status()
            return status if status.done else None

        result: RunStatus = wait_until_finished(
            self._engine, str(self.id), timeout, read, self._started
        )
        return result

    def cancel(self) -> None:
        """Cancel a running run: steps not yet started never start; running ones finish.

        Raises:
            InvalidStateError: the run is not running.
        """
        _control.cancel(self._engine, self.id)

    def retry(self) -> None:
        """Run the failed and cancelled steps of a failed or cancelled run again.

        Completed steps keep their outputs.

        Raises:
            InvalidStateError: the run is running or completed, past its deadline, or one
                of its steps is still running (a cancelled run's step runs to its end), or
                one of an ended child run of its: retry once it has ended, so that no step
                ever runs twice at once.
        """
        _control.restart(self._engine, self.id, every_step=False)

    def retry_all(self) -> None:
        """Run every step of a finished run again, from the roots.

        Raises:
            InvalidStateError: the run is still running, past its deadline, or one of its
                steps is still running (as for :meth:`retry`).
        """
        _control.restart(self._engine, self.id, every_step=True)

    def signal(self, signal: str, payload: Any) -> bool:
        """Send ``signal`` with ``payload`` to this run (see ``Workflow.signal``).

        Returns True when this call stored it, False when the same payload was sent
        before.

        Raises:
            NotFoundError: the run does not exist or has no wait node for ``signal``.
            SubmitConflictError: the signal was sent already with another payload.
            InvalidStateError: the run has finished.
        """
        encoded = _waits.encode_payload(self._signal_types, signal, payload)
        with self._engine.begin() as conn:
            return _waits.send(
                _executor.Observed(conn),
                workflow=self.workflow,
                key=None,
                run_id=self.id,
                signal=signal,
                payload=encoded,
            )

    def fork(self, key: str, *, rerun: Iterable[str | Named] = ()) -> tuple[Run, bool]:
        """A new run of this workflow's current definition with this run's input, under ``key``.

        The definition is the graph of the ``Workflow`` object this handle came from (in
        this process, as deployed now). Steps this run completed keep their outputs
        (copied, not run again) unless they are named in ``rerun`` or downstream of one
        that is; every other step runs on the current code. ``submit_once`` semantics
        for ``key``: a second fork with the same key returns the first (``created``
        False). One transaction: a crash leaves no half-made run. The fork's
        ``RunStatus.forked_from`` names this run; it has no deadline and keeps this
        run's retention.

        Raises:
            InvalidKeyError: a bad key (nothing is sent).
            DefinitionError: a step to keep is no longer defined or its upstream steps
                changed (the message names it), or ``rerun`` names no step of either
                graph; nothing is written.
            InvalidStateError: this run is still running, or one of its steps is.
            NotFoundError: this run does not exist (purged).
            SubmitConflictError: the key's run has another input than this run.
            TypeError: this handle was not made by a ``Workflow`` (a bare ``Run``), or
                ``rerun`` is a str or holds something other than steps and step names.
        """
        definition = self._definition
        if definition is None:
            raise TypeError(
                f"run {self.id}: fork needs the handle of a Workflow object, "
                "e.g. workflow.run(engine, run_id).fork(...)"
            )
        names = _step_names(rerun)
        forked = _fork.fork(
            self._engine,
            source_id=self.id,
            workflow=self.workflow,
            graph=definition.graph(),
            key=key,
            rerun=names,
        )
        return definition._handle_of(self._engine, forked.run_id, key), forked.created

    def set_retention(self, retention: timedelta | None) -> None:
        """Keep this run for ``retention`` after it ends (None: the sweeper's default).

        Raises:
            TypeError: ``retention`` is neither a timedelta nor None.
            ValueError: it is negative, or longer than 1,000 years.
            NotFoundError: the run does not exist (purged).
        """
        if retention is not None and not isinstance(retention, timedelta):
            raise TypeError(f"retention takes a timedelta or None, not {type(retention).__name__}")
        if retention is not None and retention < timedelta():
            raise ValueError("retention must be a non-negative timedelta or None")
        if retention is not None:
            _timing.check_duration(retention, "retention")
        if not _control.set_retention(self._engine, self.id, retention):
            raise errors.NotFoundError(f"run {self.id} does not exist")


def _step_names(rerun: Iterable[str | Named]) -> list[str]:
    """The step names of a fork's ``rerun=``: each item a name or a step.

    A str is a TypeError rather than the names of its letters (``rerun="label"`` refused
    step ``'l'``, and ``rerun="ab"`` re-ran steps ``a`` and ``b``), and an item that is
    neither a name nor a step one rather than an AttributeError.
    """
    if isinstance(rerun, str):
        raise TypeError(f"rerun= takes a list of steps or step names, such as [{rerun!r}]")
    names = []
    for step in rerun:
        name = step if isinstance(step, str) else getattr(step, "name", None)
        if not isinstance(name, str):
            raise TypeError(f"rerun= takes steps or step names, not {type(step).__name__}")
        names.append(name)
    return names


class ResultRun(Run, Generic[Out]):
    """A run of a ResultWorkflow: :meth:`result` returns its result node's output."""

    def __init__(
        self,
        engine: Engine,
        run_id: uuid.UUID,
        workflow: str,
        key: str | None = None,
        output_type: Any = Any,
        *,
        started: float | None = None,
        signal_types: Mapping[str, Any] | None = None,
        definition: Definition | None = None,
    ) -> None:
        super().__init__(
            engine,
            run_id,
            workflow,
            key,
            started=started,
            signal_types=signal_types,
            definition=definition,
        )
        self.output_type = output_type

    if TYPE_CHECKING:

        def fork(
            self, key: str, *, rerun: Iterable[str | Named] = ()
        ) -> tuple[ResultRun[Out], bool]: ...

    def _read_result(self) -> tuple[RunState, str | None, str | None]:
        row = _reads.run_result(self._engine, self.id)
        if row is None:
            raise errors.NotFoundError(f"run {self.id} does not exist (purged, or not committed)")
        return RunState(row[0]), row[1], row[2]

    def result(self, timeout: float | None = None) -> Out:
        """Wait for the run and return its result, decoded to the workflow's output type.

        Raises:
            NoOutputError: the run has no result node.
            RunFailedError: the run failed or was cancelled.
            TimeoutError: ``timeout`` seconds passed first.
        """

        def read() -> tuple[RunState, str | None] | None:
            state, result_step, output = self._read_result()
            if result_step is None:
                raise errors.NoOutputError(run_id=self.id, workflow=self.workflow)
            return (state, output) if state in TERMINAL_RUN_STATES else None

        deadline = deadline_of(timeout)
        state, output = wait_until_finished(
            self._engine, str(self.id), timeout, read, self._started
        )
        if state != RunState.COMPLETED:
            status = read_within(self.status, deadline, str(self.id))
            raise errors.RunFailedError(
                run_id=self.id,
                workflow=self.workflow,
                state=state.value,
                step=status.failed_step,
                error=status.error,
            )
        assert output is not None
        value: Out = _codec.decode(output, self.output_type)
        return value
