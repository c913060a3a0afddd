"""``Worker``: claims jobs of the workflows and step kinds it knows, runs them, records outcomes.

One loop thread claims in batches (``FOR UPDATE SKIP LOCKED``) and records finished jobs
in the same statement as the next claim; daemon threads run the steps. An idle worker
records that it waits for work (new work rings only then, see
:mod:`cyclone._store.notify`) and sleeps until ``NOTIFY cyclone_jobs_available`` or its
poll interval, on the socket of the connection it claims on, which LISTENs (the
engine's listener wakes it where that connection cannot hold a session). Each claim takes a lease
(:attr:`cyclone._store.claim.Claimed.lease`) that every outcome and heartbeat presents: a
worker that lost a job (rescued, handed back, retried) has its late outcome refused. A
heartbeat thread on a connection of its own marks held jobs alive, and the worker's own
row in ``cyclone_workers`` (:mod:`cyclone._store.workers`, written when it starts serving,
deleted when it stops); a worker that dies mid-step stops beating, and the maintenance
leader (:mod:`cyclone._leader`) hands its jobs back and deletes its row after
``rescue_after``. An outcome that cannot be recorded (the database is
away) is kept, still heartbeaten, and recorded when the database answers again.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import os
import queue
import select
import signal
import socket
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any

from sqlalchemy import Connection, Engine

from cyclone import _leader, _observe, _retry, _step_runner, _timing, errors, migrations, schedules
from cyclone._store import binds as _binds
from cyclone._store import children as _children
from cyclone._store import claim as _claim
from cyclone._store import completion as _completion
from cyclone._store import deadline as _deadline
from cyclone._store import due as _due
from cyclone._store import executor as _executor
from cyclone._store import fanout as _fanout
from cyclone._store import leadership as _leadership
from cyclone._store import limits as _limits_store
from cyclone._store import notify as _notify
from cyclone._store import rescue as _rescue
from cyclone._store import sweep as _sweeper
from cyclone._store import waits as _waits
from cyclone._store import workers as _workers
from cyclone.limits import Spec as LimitSpec
from cyclone.workflow import StandaloneStep, Workflow, check_name

log = logging.getLogger("cyclone.worker")

DEFAULT_CONCURRENCY = 4
MAX_CONCURRENCY = 10_000
"""The most jobs a Worker runs at once, and the largest per-queue limit: it starts a
thread per job it may run, so ``concurrency=10**20`` hung starting threads (and would
have failed every claim, past ``bigint``)."""
DEFAULT_POLL_INTERVAL = 5.0
DEFAULT_HEARTBEAT_INTERVAL = timedelta(seconds=5)
DEFAULT_RESCUE_AFTER = timedelta(minutes=1)
DEFAULT_RETENTION = _sweeper.DEFAULT_KEEP
"""How long the sweeper keeps a finished run that has no ``retention`` of its own."""
IDLE_WAKE = 1.0
"""The longest an idle loop sleeps without a NOTIFY, a finished job or a poll due."""
SHORT_STEP = 0.01
SHORT_STEP_BATCH = 48
JOIN_TIMEOUT = 10.0
DEREGISTER_WITHIN = 2.0
"""Seconds each try of a stopping worker to delete its row gets (the heartbeat's
connection, then a new one), whatever the network does: a stop never waits longer."""
RETRY_FIRST = 0.5
RETRY_CAP = 30.0
"""A database that cannot be reached is tried again after 0.5 s, doubling up to 30 s."""
DUE_SLACK = 0.005
"""Seconds added to a scheduled job's due time, so the claim that wakes for it finds it due."""


def _due_after(seconds: float) -> float:
    """The monotonic moment to claim a job that a statement just answered is due in
    ``seconds`` from its ``now()``: counted from its answer, not from when it was sent.

    The server starts the statement's transaction some time after it is sent (on a loaded
    machine, tens of milliseconds), so a wake counted from the sending could claim before
    the due moment of the server's clock: that claim finds nothing, and the read after it
    no longer sees what it waited for (the job now due is not scheduled later; a full
    rate window has rolled over), so the worker slept until its poll. Counted from the
    answer, the claim's ``now()`` is past the due moment; a statement that waited for a
    lock only delays the wake by that wait.
    """
    return time.monotonic() + seconds + DUE_SLACK


WAIT_RECORD = 60.0
"""How long an idle worker's record in ``cyclone_waiters`` lasts; renewed halfway."""
CONTENDED_RETRY = 0.002
CONTENDED_CAP = 0.5
"""Seconds before claiming again when a limited claim could not serve a key with room and
a due job (another claim held it, or had just claimed from it), or an admission skipped a
key with a held run due (another transaction held it): 2 ms, doubling up to 0.5 s while
it stays so (a transaction holding a key's lock, a fork's)."""
SETTLE_RETRY = 0.01
SETTLE_CAP = 0.5
"""Seconds between looks at the ring slots still held when an idle worker recorded itself:
0.01 s, doubling up to 0.5 s, so a transaction left open (a web request's) is not polled
a hundred times a second; the worker, recorded, is rung by any new work meanwhile."""
ADOPT_INTERVAL = 60.0
"""Seconds between a serving worker's looks for limits its definitions no longer name."""
STOPPING_REPORT = 30.0
"""Seconds between the log lines of a stopping worker that still waits for running jobs."""

Outcome = _waits.Outcome


def _check_sequence(name: str, given: object, example: str) -> None:
    """Refuse a single definition where a collection of them is expected."""
    if isinstance(given, Workflow | StandaloneStep | str):
        raise errors.DefinitionError(
            f"{name}= takes a list, got a single {type(given).__name__}: pass {example}"
        )


def _check_items(name: str, given: Sequence[object], kind: type, what: str) -> None:
    """Refuse an item of ``name=`` that is not a ``kind``: one given to the other option
    (a step kind in ``workflows=``) failed later with an AttributeError."""
    for item in given:
        if not isinstance(item, kind):
            raise errors.DefinitionError(
                f"{name}= takes definitions, each {what}, not {type(item).__name__}"
            )


@dataclass
class WorkerStats:
    """What the last :meth:`Worker.drain` or :meth:`Worker.run` did, by outcome recorded.

    ``completed``: steps that succeeded; ``retried``: failed attempts with attempts left;
    ``failed``: final failures; ``refused``: outcomes refused because the job's lease had
    moved on (rescued, handed back, retried or cancelled meanwhile); ``handed_back``:
    jobs returned unfinished when the worker stopped.
    """

    completed: int = 0
    retried: int = 0
    failed: int = 0
    refused: int = 0
    handed_back: int = 0

    @property
    def total(self) -> int:
        """Attempts run and recorded: completed, retried and failed."""
        return self.completed + self.retried + self.failed


def backoff_delay(failures: int) -> float:
    """Seconds before try ``failures + 1`` of a database that failed ``failures`` times."""
    return _retry.doubling(RETRY_FIRST, RETRY_CAP, failures)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


class _StepThreads:
    """Daemon threads that run steps: a step still running when its job was handed back
    does not keep the process alive."""

    def __init__(self, count: int, run: Callable[[_claim.Claimed], None]) -> None:
        self._queue: queue.SimpleQueue[_claim.Claimed | None] = queue.SimpleQueue()
        self._run = run
        self._threads = [
            threading.Thread(target=self._work, name=f"cyclone-step_{i}", daemon=True)
            for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: _claim.Claimed) -> None:
        self._queue.put(job)

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            self._run(job)

    def shutdown(self, *, wait: bool) -> None:
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


def _readable(fds: list[int], timeout: float) -> list[int]:
    """The descriptors of ``fds`` readable (or closed) within ``timeout`` seconds."""
    if hasattr(select, "poll"):  # any descriptor number, unlike select()
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        return [fd for fd, _event in poller.poll(max(0.0, timeout) * 1000)]
    ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
    return ready


class _Flag:
    """A flag set from any thread, or from a signal handler.

    Unlike ``threading.Event``, setting and clearing it take no lock: a handler that ran
    while the main thread held an Event's lock (clearing it) and set that Event would
    wait for the main thread, which waits for the handler.
    """

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


class _Doorbell:
    """The claim loop's wake-up, rung from any thread: a finished step, a stop, a signal.

    Like an ``Event`` (``set``/``wait``/``clear``), but its wait also watches the held
    connection's socket when given one (see :meth:`open`): a NOTIFY there wakes the loop
    directly, with no listener thread handing it over. Ringing takes no lock, so a
    signal handler may ring it. Its socket pair exists while a loop serves
    (:meth:`open` to :meth:`close`).
    """

    def __init__(self) -> None:
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._rung = False
        self._written = False
        self._held: _executor.Held | None = None

    def open(self, held: _executor.Held | None) -> None:
        """Make the socket pair; with ``held``, also wake for what arrives on its connection."""
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        self._pair = (reader, writer)
        self._written = False
        if self._rung:
            self._ring(writer)
        self._held = held

    def close(self) -> None:
        pair, self._pair = self._pair, None
        self._held = None
        if pair is not None:
            for sock in pair:
                sock.close()

    def set(self) -> None:
        if self._rung:
            return
        self._rung = True
        pair = self._pair
        if pair is not None:
            self._ring(pair[1])

    def _ring(self, writer: socket.socket) -> None:
        self._written = True
        with contextlib.suppress(OSError):  # full (rung already), or closed meanwhile
            writer.send(b"\0")

    def clear(self) -> None:
        self._rung = False
        pair = self._pair
        if self._written and pair is not None:
            self._written = False
            self._drain(pair[0])

    @staticmethod
    def _drain(reader: socket.socket) -> None:
        with contextlib.suppress(OSError):
            reader.recv(4096)

    def wait(self, timeout: float) -> bool:
        """Wait until rung or ``timeout`` seconds passed; True if rung.

        A byte whose ring was already cleared (its writer was slower than the clear) and
        a socket that carried no notification do not end the wait.
        """
        end = time.monotonic() + timeout
        while not self._rung:
            pair = self._pair
            if pair is None:
                return False
            held = self._held
            fd = None if held is None else held.fileno()
            reader = pair[0].fileno()
            ready = _readable([reader] if fd is None else [reader, fd], end - time.monotonic())
            if not ready:
                return self._rung
            if held is not None and fd in ready and not held.poll():
                self.set()  # the connection failed: the loop's next statement opens another
            if reader in ready and not self._rung:
                self._drain(pair[0])
        return True


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_grace(grace: float | None) -> float | None:
    """``grace`` (seconds, or None), checked before the worker relies on it: a NaN grace
    handed nothing back, ever, and a wrong type failed inside the signal handler."""
    if grace is None:
        return None
    if isinstance(grace, bool) or not isinstance(grace, int | float):
        raise TypeError(f"grace= takes seconds (a number), not {type(grace).__name__}")
    if not grace >= 0:
        raise ValueError(f"grace= takes a number of seconds >= 0, not {grace!r}")
    return grace


def _check_worker_options(
    concurrency: object,
    poll_interval: object,
    heartbeat_interval: object,
    rescue_after: object,
    retention: object,
    sweep_interval: object,
) -> None:
    """Refuse a Worker's options that it could only fail on later, each time: a retention
    of ``timedelta.max`` made every sweep fail in the driver, a NaN poll interval failed
    the loop's wait, a str concurrency a comparison."""
    if not _is_count(concurrency):
        raise TypeError(f"concurrency= takes an int, not {type(concurrency).__name__}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:  # type: ignore[operator]
        raise ValueError(f"concurrency must be from 1 to {MAX_CONCURRENCY:,}, not {concurrency}")
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float):
        raise TypeError(f"poll_interval= takes seconds, not {type(poll_interval).__name__}")
    if not 0 < poll_interval < float("inf"):
        raise ValueError(
            f"poll_interval= takes a positive number of seconds, not {poll_interval!r}"
        )
    for what, value in (
        ("heartbeat_interval", heartbeat_interval),
        ("rescue_after", rescue_after),
        ("sweep_interval", sweep_interval),
        ("retention", retention),
    ):
        if not isinstance(value, timedelta):
            raise TypeError(f"{what}= takes a timedelta, not {type(value).__name__}")
    for what, value in (
        ("heartbeat_interval", heartbeat_interval),
        ("rescue_after", rescue_after),
        ("sweep_interval", sweep_interval),
    ):
        assert isinstance(value, timedelta)
        if value <= timedelta():
            raise ValueError(f"{what}= takes a positive timedelta, not {value!r}")
        _timing.check_duration(value, f"{what}=")
    assert isinstance(retention, timedelta)
    if retention < timedelta():
        raise ValueError(f"retention= takes a non-negative timedelta, not {retention!r}")
    _timing.check_duration(retention, "retention=")


class Worker:
    """Runs the jobs of the given workflows and standalone step kinds.

    Args:
        bind: an Engine or a Client.
        workflows: the workflows whose steps this worker runs.
        steps: the standalone step kinds this worker runs.
        concurrency: how many jobs run at once (threads), over all queues; at most
            :data:`MAX_CONCURRENCY`.
        queues: ``{"queue": limit}`` to run only these queues, each with its own limit
            (the total is still capped by ``concurrency``); default: every queue, so a
            run whose step a redeploy moved to another queue still runs.
        poll_interval: seconds between polls when no notification arrives.
        heartbeat_interval: how often running jobs are marked alive; less than
            ``rescue_after``.
        rescue_after: this worker's running jobs are run again, and its row of the
            registry deleted, once it has not beaten for this long: it records this in
            its row, and whichever worker leads maintenance judges it by it (the leader's
            own only for a worker that recorded none). Also the maintenance leader's lease
            when this worker leads: a leader that stops renewing it is replaced within
            this plus one interval (at most a second).
        backoff: seconds to wait before attempt ``n + 1`` of a step that raised on
            attempt ``n`` (default: exponential from 1 s, capped at 5 min, with jitter).
        sweep: run the sweeper from :meth:`run`: the maintenance leader purges the finished
            runs and standalone jobs whose retention has passed.
        retention: how long the sweeper keeps a finished run that has no ``retention`` of
            its own, and a finished standalone job (default 7 days).
        sweep_interval: how often the sweeper runs.
        sweep_keep: the former name of ``retention`` (deprecated: it warns).
        step_context: called before each step; the context manager it returns is entered
            around the step (a framework's application context, or Django's connection
            housekeeping). An error it raises counts as the step's error.

    :meth:`run` also registers the schedules of ``workflows`` (``wf.schedule(...)``) and
    fires their ticks on a thread of its own; :meth:`drain` does not fire them.

    Raises:
        ValueError: ``heartbeat_interval`` is not less than ``rescue_after``, or a limit
            is below 1.
    """

    def __init__(
        self,
        bind: _binds.Bind,
        *,
        workflows: Iterable[Workflow[Any]] = (),
        steps: Iterable[StandaloneStep[Any, Any]] = (),
        concurrency: int = DEFAULT_CONCURRENCY,
        queues: Mapping[str, int] | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        heartbeat_interval: timedelta = DEFAULT_HEARTBEAT_INTERVAL,
        rescue_after: timedelta = DEFAULT_RESCUE_AFTER,
        backoff: Callable[[int], float] | None = None,
        sweep: bool = True,
        retention: timedelta = DEFAULT_RETENTION,
        sweep_interval: timedelta = _sweeper.DEFAULT_INTERVAL,
        step_context: Callable[[], AbstractContextManager[object]] | None = None,
        sweep_keep: timedelta | None = None,
    ) -> None:
        if sweep_keep is not None:
            warnings.warn(
                "Worker(sweep_keep=) is deprecated: pass retention= (the same duration)",
                DeprecationWarning,
                stacklevel=2,
            )
            if retention != DEFAULT_RETENTION and retention != sweep_keep:
                raise ValueError("give retention= or its former name sweep_keep=, not both")
            retention = sweep_keep
        self.engine: Engine = _binds.engine_of(bind)
        _check_sequence("workflows", workflows, "workflows=[wf]")
        _check_sequence("steps", steps, "steps=[send_email]")
        workflows, steps = list(workflows), list(steps)
        _check_items("workflows", workflows, Workflow, "a Workflow (steps= takes step kinds)")
        _check_items("steps", steps, StandaloneStep, "a step kind made by @cyclone.step")
        self.workflows: dict[str, Workflow[Any]] = {}
        for wf in workflows:
            if wf.name in self.workflows and self.workflows[wf.name] is not wf:
                raise errors.DefinitionError(f"two workflows named {wf.name!r} given to a Worker")
            wf.plan()
            self.workflows[wf.name] = wf
        # The steps whose success may unblock another: upstreams, and the items of a map
        # node (the last one makes the node available to collect them).
        self._upstream: dict[str, frozenset[str]] = {
            name: frozenset(dep for node in wf.graph().steps for dep in node.after)
            | {node.name for node in wf.graph().steps if node.over is not None}
            for name, wf in self.workflows.items()
        }
        self._child_nodes = any(
            node.child is not None for wf in self.workflows.values() for node in wf.steps.values()
        )
        """Whether it serves child nodes: it then delivers the ends of child runs, woken by
        every run's end (``cyclone_run_finished``) as well as by new jobs."""
        self._draining = False
        self.steps: dict[str, StandaloneStep[Any, Any]] = {}
        for st in steps:
            if st.kind in self.steps and self.steps[st.kind] is not st:
                raise errors.DefinitionError(f"two step kinds named {st.kind!r} given to a Worker")
            self.steps[st.kind] = st
        self.schedules = schedules.collect(self.workflows.values())
        specs: dict[str, LimitSpec] = {}
        workflow_specs = [wf.limit for wf in self.workflows.values() if wf.limit is not None]
        step_specs = [
            spec for wf in self.workflows.values() for spec in wf._limited_steps().values()
        ]
        primary = [
            spec
            for spec in [st.limit for st in self.steps.values()] + workflow_specs + step_specs
            if spec is not None
        ]
        paired = [spec.rate for spec in primary if spec.rate is not None]
        for spec in primary + paired:
            other = specs.setdefault(spec.name, spec)
            if (other.max, other.per, other.counts) != (spec.max, spec.per, spec.counts):
                raise errors.DefinitionError(
                    f"limit {spec.name!r} is defined twice with different values"
                )
        self._limit_specs = specs
        self._admits: tuple[str, ...] = tuple(sorted({spec.name for spec in workflow_specs}))
        """The limits of the workflows served: their held runs are admitted by ``admit_runs``."""
        self._gated: tuple[str, ...] = tuple(
            sorted({spec.name for spec in primary if spec.counts != "runs"})
        )
        """The limits of the step kinds and workflow steps served: their jobs are claimed by
        ``claim_gated``."""
        self._gated_kinds = frozenset(
            [(None, k) for k, st in self.steps.items() if st.limit is not None]
            + [(wf.name, step) for wf in self.workflows.values() for step in wf._limited_steps()]
        )
        """The (workflow, kind) of the limited jobs served by its definitions."""
        self._unlimited_kinds: frozenset[str] = frozenset()
        """Limited kinds with jobs enqueued before their limit: the ordinary claim takes those."""
        self._limited: dict[tuple[int, int], tuple[str, str]] = {}
        """The slot (limit name, key) of each job in flight, by ``(id, lease)``, that a
        limited claim took: one leaving running frees it, of a limit it defines or one it
        took on (``_adopt_limits``)."""
        self._freed: Counter[tuple[str, str]] = Counter()
        """Slots freed by jobs that ended, failed, were handed back or parked (a child node
        that finds its child submitted parks again) and not rung for yet: kept until a
        round of claims succeeds, then rung for unless this worker took each again."""
        self._contended = 0
        """Keys with room and a due job that the last limited claims could not serve, and
        keys with a held run due that its admission skipped (another transaction held
        them)."""
        self._contention_looks = 0
        self._served = _limits_store.Served(
            tuple(sorted(self.steps)), tuple(sorted(self.workflows))
        )
        """What the limited claim may take: a limit's name can be another worker's too."""
        self._adopted_at = 0.0
        self._gated_steps = bool(step_specs)
        """Whether a served limit is a workflow step's: the limited claim reads runs too."""
        self._paired = bool(paired)
        self._paired_rates = tuple(sorted({spec.name for spec in paired}))
        self._rated = bool(paired) or any(spec.per is not None for spec in primary)
        """Whether a served definition has a Rate, whose windows open without a NOTIFY."""
        """Whether a served definition has a Rate with its Concurrency: the limited claim
        checks and counts the jobs' second limit too."""
        if not self.workflows and not self.steps:
            raise errors.DefinitionError("a Worker needs at least one workflow or step kind")
        _check_worker_options(
            concurrency, poll_interval, heartbeat_interval, rescue_after, retention, sweep_interval
        )
        if heartbeat_interval >= rescue_after:
            raise ValueError(
                f"heartbeat_interval ({heartbeat_interval}) must be less than rescue_after "
                f"({rescue_after}): live jobs would be rescued and run twice"
            )
        self.concurrency = concurrency
        self.queues: list[str] | None = None
        self._limits: dict[str, int] | None = None
        if queues is not None:
            if (
                not isinstance(queues, Mapping)
                or not queues
                or any(
                    not _is_count(limit) or not 1 <= limit <= MAX_CONCURRENCY
                    for limit in queues.values()
                )
            ):
                raise ValueError(
                    f"queues= maps queue names to limits from 1 to {MAX_CONCURRENCY:,}"
                )
            for name in queues:
                try:
                    check_name("a queue name of queues=", name)
                except errors.DefinitionError as exc:
                    raise ValueError(str(exc)) from None
            self._limits = dict(queues)
            self.queues = sorted(queues)
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval.total_seconds()
        self.rescue_after = rescue_after
        self.backoff = backoff or _retry.exponential()
        self.sweep = sweep
        self.retention = retention
        self.sweep_interval = sweep_interval.total_seconds()
        self.step_context = step_context
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stats = WorkerStats()
        _observe.serving(self)

        self._outcomes: queue.SimpleQueue[tuple[_claim.Claimed, Outcome]] = queue.SimpleQueue()
        self._wake = _Doorbell()
        self._stopping = _Flag()
        self._abandon = _Flag()
        self._stop_deadline: float | None = None
        self._stop_reported: float | None = None
        """When a stopping worker last said which running jobs it waits for (monotonic)."""
        self._grace: float | None = None
        # Keyed by (job id, lease): a rescued job can be claimed again by this worker while
        # its earlier execution still runs, and each execution's outcome is its own.
        self._inflight: dict[tuple[int, int], _claim.Claimed] = {}
        self._pending: dict[tuple[int, int], tuple[_claim.Claimed, Outcome]] = {}
        self._busy: Counter[str] = Counter()
        self._steps_pool: _StepThreads | None = None
        self._claim_turn = 0
        self._delivered = 0
        """Wait nodes the last record-and-claim woke by delivering their signals."""
        self._unblocked = 0
        """Jobs the last record made available (its claim's snapshot cannot see them)."""
        self._saw_all = False
        """Whether the last claim left room and saw no work it could not take (no signal
        delivered, no job made available beside it): work made available later rings. A
        row it skipped as locked by a transaction that then left it unchanged rings
        nothing: the poll finds it, as for a sleeping worker."""
        self._lock = threading.Lock()
        self._db_failures = 0
        self._step_seconds = 1.0
        self._held: _executor.Held | None = None
        self._side: Engine | None = None
        self._schema_checked = False
        self._leader: _leader.Leader | None = None
        self._beating = threading.Event()
        self._beat_now = threading.Event()
        """Wakes the heartbeat thread before its interval: to record the stop, or to end."""
        self._stop_told = False
        """Whether the claim loop has told the heartbeat thread that the worker is stopping."""
        self._recheck_due = True
        """Whether the next claim is a woken one: it delivers signals and reads when the
        next job falls due (set by a NOTIFY, kept until a claim succeeds)."""
        self._due_unknown = True
        """Whether a NOTIFY or poll came since the worker last read when its next job falls
        due: the next claim reads it too (see :meth:`_dates_in_claim`), or else a statement
        after the next claim that finds nothing."""
        self._due_at = float("inf")
        """When (monotonic) the next job this worker serves falls due, as last read."""
        self._due_failures = 0
        """Failed reads of :attr:`_due_at` in a row: the next comes after a backoff."""
        self._dated: float | None = None
        """The time the last record-and-claim read for :attr:`_due_at`, if it read one."""
        self._heard_on: int | None = None
        """The held connection that LISTENed at the last successful claim: another (or
        none) may have missed a NOTIFY, so the next claim is a woken one."""
        self._scopes: dict[str, _claim.Scope] = {}
        self._hears = False
        """Whether a NOTIFY reaches this worker's loop (else it polls, and records no wait)."""
        self._hears_on_held = False
        """Whether that NOTIFY arrives on the held connection (else through the listener)."""
        self._recorded_until: float | None = None
        """While recorded as waiting for work: when (monotonic) the record lapses at the latest."""
        self._unsettled: tuple[int, ...] = ()
        self._looks = 0
        """Looks at the ring slots since the record was made: the next comes later."""
        self._record_again_at = 0.0
        """After a failed record: when (monotonic) to try again; until then it polls."""
        self._record_failures = 0
        """Failed records in a row: the next try waits :func:`backoff_delay` of it."""

    def __repr__(self) -> str:
        return (
            f"<cyclone.Worker {self.id} workflows={list(self.workflows)} steps={list(self.steps)}>"
        )

    @property
    def sweep_keep(self) -> timedelta:
        """The former name of :attr:`retention` (deprecated: it warns)."""
        warnings.warn(
            "Worker.sweep_keep is deprecated: read Worker.retention",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.retention

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop, wait for a :meth:`run` or :meth:`drain` in another thread to return, and
        close the connections this worker opened outside the pool (idempotent)."""
        self.stop()
        _observe.retired(self)
        with self._lock:
            if self._held is not None:
                self._held.close()
            self._stopping.clear()

    def drain(self) -> int:
        """Run everything runnable now, including steps unblocked meanwhile; return the count.

        The count is :attr:`stats`' ``total``: attempts run and recorded (completed,
        retried, failed); :attr:`stats` tells them apart. Jobs scheduled for later (a
        retry's backoff, ``run_at=``) are left for later. Runs past their deadline are
        failed first and last.
        """
        self._serve(until_idle=True)
        return self.stats.total

    def run(self, grace: float | None = None) -> None:
        """Run jobs until SIGINT/SIGTERM or :meth:`stop`.

        On the first signal the worker stops claiming and lets the jobs in flight finish
        for up to ``grace`` seconds (None: as long as they take); then it hands the rest
        back (available again at once, under a new lease, the attempt not counted) and
        returns. A second signal hands them back at once.
        """
        previous: dict[signal.Signals, Any] = {}
        self._grace = _checked_grace(grace)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self._serve(until_idle=False)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self, grace: float | None = None) -> None:
        """Ask :meth:`run` to stop claiming and return once the jobs in flight are done.

        With ``grace``, jobs still running after that many seconds are handed back.

        Raises:
            TypeError: ``grace`` is not a number of seconds.
            ValueError: ``grace`` is negative or NaN (NaN handed nothing back, ever).
        """
        checked = _checked_grace(grace)
        if checked is not None:
            self._stop_deadline = time.monotonic() + checked
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping.is_set():
            log.warning("worker %s: second signal %d, handing back its jobs now", self.id, signum)
            self._abandon.set()
            self._wake.set()
            return
        grace = self._grace
        log.info(
            "worker %s stopping on signal %d; jobs in flight get %s",
            self.id,
            signum,
            "as long as they take" if grace is None else f"{grace:g}s",
        )
        self.stop(grace)

    def _check_grants(self) -> None:
        """Say at start which privileges of :data:`cyclone.migrations.GRANTS` its role lacks.

        A worker without them runs, and the statements that need them fail for as long as
        it does: without ``UPDATE`` on ``cyclone_leader``, say, it never leads, and no
        job of a dead worker is rescued. One error at start names them all.
        """
        missing = migrations.missing_grants(self.engine)
        if missing:
            log.error(
                "worker %s: the database role lacks %s: the statements that need them will "
                "fail (the grants are in cyclone's docs/deployment.md)",
                self.id,
                ", ".join(missing),
            )

    def _serve(self, *, until_idle: bool) -> None:
        with self._lock:
            if not self._schema_checked:
                migrations.check_schema_at_start(self.engine)  # once: not started without it
                self._check_grants()
                self._register_limits()
                self._schema_checked = True
            self._register()
            self.stats = WorkerStats()
            self._draining = until_idle
            _observe.serving(self)
            self._steps_pool = _StepThreads(self.concurrency, self._execute)
            # The loop sleeps on its own connection's socket, which LISTENs, unless that
            # connection cannot hold a session (a pooler) or is not one connection (an
            # observed engine's statements go through the pool): then the listener wakes it.
            if _executor.session_engine(self.engine) is self.engine and not _executor.observed(
                self.engine
            ):
                channels: tuple[str, ...] = (_notify.JOBS_AVAILABLE,)
                if self._child_nodes:
                    channels += (_notify.RUN_FINISHED,)
                self._held = _executor.Held(
                    self.engine,
                    listen=channels,
                    on_notify=self._on_notified,
                    sized=_claim.PLANNED_ON,
                )
                self._wake.open(self._held)
                unsubscribe: Callable[[], None] = _no_op
                self._hears = self._hears_on_held = True
            else:
                self._held = _executor.Held(self.engine, sized=_claim.PLANNED_ON)
                self._wake.open(None)
                self._hears_on_held = False
                listener = _notify.listener(self.engine)
                unsubscribes = [listener.subscribe(_notify.JOBS_AVAILABLE, self._on_jobs_available)]
                if self._child_nodes:
                    unsubscribes.append(
                        listener.subscribe(_notify.RUN_FINISHED, self._on_jobs_available)
                    )
                self._hears = not isinstance(listener, _notify.Polling)

                def unsubscribe() -> None:
                    for each in unsubscribes:
                        each()

            side = self._side_engine()
            self._leader = _leader.Leader(
                side,
                self.id,
                rescue_after=self.rescue_after,
                sweep=self.sweep and not until_idle,
                sweep_keep=self.retention,
                sweep_interval=self.sweep_interval,
            )
            beater = threading.Thread(
                target=self._beat, args=(side,), name="cyclone-heartbeat", daemon=True
            )
            self._beating.clear()
            self._beat_now.clear()
            beater.start()
            abandoned = False
            scheduler: schedules.Scheduler | None = None
            try:
                if self.schedules and not until_idle:
                    scheduler = schedules.Scheduler(self.engine, self.schedules, self._stopping)
                    scheduler.start()
                if until_idle:
                    self._maintain_once()
                self._leader.start()
                abandoned = self._loop(until_idle)
                self._ring_freed()  # slots freed by its last outcomes, claimed by no one here
                if until_idle:
                    self._leader.stop(release=False)
                    self._maintain_once()
            finally:
                if scheduler is not None:
                    self._stopping.set()
                    scheduler.stop()
                    scheduler.join(JOIN_TIMEOUT)
                unsubscribe()
                self._leader.stop()
                self._leader = None
                self._beating.set()
                self._beat_now.set()
                beater.join(JOIN_TIMEOUT)
                self._stop_told = False
                self._steps_pool.shutdown(wait=not abandoned)
                self._steps_pool = None
                self._stop_waiting()
                self._wake.close()
                self._held.close()
                self._held = None
                side.dispose()
                # Done serving: its owner may dispose of the engine now, and a gauge read
                # through it would open a connection left open until garbage collection.
                _observe.retired(self)
                self._stopping.clear()
                self._abandon.clear()
                self._stop_deadline = None
                self._stop_reported = None
                self._heard_on = None
                self._due_unknown = True
                self._due_at = float("inf")
                self._inflight.clear()
                self._limited.clear()
                self._freed.clear()
                self._pending.clear()
                self._busy.clear()

    def _side_engine(self) -> Engine:
        """The engine of this worker's own connections (leader, heartbeat): made at its
        first serve and kept, so that its statements compiled there stay compiled from one
        drain to the next; each serve gives it a fresh copy of the application's pool."""
        if self._side is None:
            self._side = _leadership.side_engine(self.engine)
        else:
            _leadership.repool(self._side, self.engine)
        return self._side

    def _registration(self) -> _workers.Registration:
        host, pid, _ = self.id.rsplit(":", 2)
        return _workers.Registration(
            worker_id=self.id,
            host=host,
            pid=int(pid),
            concurrency=self.concurrency,
            queues=self.queues,
            workflows=sorted(self.workflows),
            steps=sorted(self.steps),
            version=_version(),
            rescue_after=self.rescue_after,
        )

    def _register(self) -> None:
        """Write this worker's row in ``cyclone_workers`` before its first claim (one
        statement), so operators see it (:meth:`cyclone.Client.list_workers`).

        A worker that cannot (its role lacks the grant, say) does not start: it would run
        unseen, and its heartbeats would fail for as long as it runs.
        """
        try:
            with _executor.connect(self.engine) as conn:
                _workers.register(conn, self._registration())
        except Exception as exc:
            log.error(
                "worker %s cannot register in cyclone_workers (%s): it does not start",
                self.id,
                _first_line(exc),
            )
            raise

    def _register_limits(self) -> None:
        """Write the served kinds' limits as defined (an operator's ``max`` is kept).

        Raises:
            DefinitionError: a stored limit of the same name counts something else.
        """
        if not self._limit_specs:
            return
        with _executor.connect(self.engine) as conn:
            for spec in self._limit_specs.values():
                params = _limits_store.spec_params(
                    spec.name, spec.max, spec.per, spec.on_limit, spec.counts
                )
                counts = _limits_store.register(conn, params)
                if counts is not None and counts != spec.counts:
                    raise errors.DefinitionError(
                        f"limit {spec.name!r} counts {counts} elsewhere, {spec.counts} here: "
                        "give the definitions different names"
                    )

    def _adopt_limits(self) -> bool:
        """Serve the limits that waiting steps, jobs and held runs of the served definitions
        are under although no served definition names them (see
        :func:`cyclone._store.limits.orphans`), and the Rates their jobs keep beside a
        served limit: before its first claim, then after a claim at most every
        ``ADOPT_INTERVAL`` while it serves, busy or idle, and before a drain ends. It also
        looks for jobs of its limited kinds enqueued before the kind had a limit: the
        ordinary claim takes those. Whether it found any; a failed look is logged and
        tried again later."""
        self._adopted_at = time.monotonic()
        assert self._held is not None
        limited_kinds = tuple(
            sorted(k for w, k in self._gated_kinds if w is None and k not in self._unlimited_kinds)
        )
        try:  # on the worker's own connection: none is left in the engine's pool
            found = _limits_store.orphans(
                self._held, self._served, self._gated, self._admits, self._paired_rates
            )
            unlimited = _limits_store.unlimited_kinds(self._held, limited_kinds)
        except Exception as exc:
            log.warning(
                "worker %s could not look for earlier limits (%s)", self.id, _first_line(exc)
            )
            return False
        if unlimited:
            log.info(
                "worker %s claims the jobs of %s enqueued before their kind had a limit",
                self.id,
                ", ".join(unlimited),
            )
            self._unlimited_kinds |= frozenset(unlimited)
            self._scopes.clear()
        rates = tuple(r for r in found.rates if r not in self._paired_rates)
        if found.gated:
            log.info(
                "worker %s serves the limits %s of jobs submitted under earlier definitions",
                self.id,
                ", ".join(found.gated),
            )
            self._gated = tuple(sorted({*self._gated, *found.gated}))
            self._gated_steps = self._gated_steps or found.steps
            self._rated = self._rated or found.rated
        if rates:
            log.info(
                "worker %s serves the Rates %s given with limits of jobs submitted under "
                "earlier definitions",
                self.id,
                ", ".join(rates),
            )
            self._paired = True
            self._paired_rates = tuple(sorted({*self._paired_rates, *rates}))
            self._rated = True
        if found.admits:
            log.info(
                "worker %s admits the held runs of the limits %s of earlier definitions",
                self.id,
                ", ".join(found.admits),
            )
            self._admits = tuple(sorted({*self._admits, *found.admits}))
        return bool(found.gated or rates or found.admits or unlimited)

    def _maintain_once(self) -> None:
        """A drain's deadline and rescue pass, if no other worker leads maintenance.

        Its session (and lead) stays for the leader thread and the last pass; the end of
        the drain closes it.
        """
        assert self._leader is not None
        try:
            self._leader.once()
        except Exception as exc:
            log.warning("worker %s maintenance failed (%s)", self.id, _first_line(exc))
            self._leader.release()

    def _beat(self, side: Engine) -> None:
        """Mark the jobs this worker holds alive, and its row in ``cyclone_workers``, on a
        connection of its own, every ``heartbeat_interval``; delete the row at the end.

        Neither the application's pool nor the claim loop can hold it up: the connection
        comes from ``side`` (:func:`cyclone._store.leadership.side_engine`), opened at once. Jobs
        whose outcome waits to be recorded are beaten too: their lease stays valid. The
        row is beaten whether or not the worker holds jobs, so an idle worker is seen
        alive; a stop is recorded in it as soon as the claim loop sees it
        (:attr:`_beat_now`), and a row pruned while the worker was silent (frozen past
        ``rescue_after``) is written again.
        """
        conn: Connection | None = None
        try:
            conn = _leadership.dedicated(side, autocommit=True)
        except Exception as exc:
            log.warning("worker %s heartbeat cannot connect yet (%s)", self.id, _first_line(exc))
        failures = 0
        delay = self.heartbeat_interval
        retry_at = 0.0
        stop_recorded = False
        try:
            while True:
                self._beat_now.wait(delay)
                self._beat_now.clear()
                if self._beating.is_set():
                    break
                delay = self.heartbeat_interval
                held = [(j.id, j.lease) for j in self._inflight.copy().values()]
                held += [(j.id, j.lease) for j, _ in self._pending.copy().values()]
                if not held and time.monotonic() < retry_at:
                    # The database is away: the row alone waits out the backoff, as the
                    # other connections do; held jobs are tried every interval, to keep
                    # their leases.
                    continue
                stopping = self._stop_told
                try:
                    if conn is None:
                        conn = _leadership.dedicated(side, autocommit=True)
                    if held:
                        _rescue.heartbeat(conn, held)
                    self._beat_row(conn, stopping and not stop_recorded)
                    stop_recorded = stop_recorded or stopping
                    failures = 0
                except Exception as exc:
                    failures += 1
                    if conn is not None:
                        _close_quietly(conn)
                        conn = None
                    backoff = backoff_delay(failures)
                    retry_at = time.monotonic() + backoff
                    delay = min(self.heartbeat_interval, backoff)
                    log.warning(
                        "worker %s heartbeat failed (%s); retrying in %.1fs",
                        self.id,
                        _first_line(exc),
                        delay if held else backoff,
                    )
        finally:
            self._deregister(conn, side)
            if conn is not None:
                _close_quietly(conn)

    def _beat_row(self, conn: Connection, record_stop: bool) -> None:
        """Beat this worker's row (recording its stop once told of it), or write it again
        when a leader deleted it: the worker was silent past ``rescue_after``."""
        found = (
            _workers.mark_stopping(conn, self.id) if record_stop else _workers.beat(conn, self.id)
        )
        if found:
            return
        log.info(
            "worker %s registers again: its row was deleted (silent past rescue_after?)", self.id
        )
        _workers.register(conn, self._registration())
        if self._stop_told:
            _workers.mark_stopping(conn, self.id)

    def _deregister(self, conn: Connection | None, side: Engine) -> None:
        """Delete this worker's row as it stops serving: on the heartbeat's connection
        and, should that fail (the connection broke since its last beat, or the heartbeat
        has none: its last try failed), once more on a new connection of ``side``. Each
        try gets :data:`DEREGISTER_WITHIN` seconds, however the network behaves (the
        socket is shut down, the connect gives up): a stop does not wait for a database
        that is away.

        A row it cannot delete is the leader's to delete once the worker has been silent
        for its ``rescue_after``.
        """
        failed: BaseException | None = None
        if conn is not None:
            try:
                driver = _deadline.driver_of(conn)
                if driver is None:
                    raise ConnectionError("the heartbeat's connection is closed")
                with _deadline.interrupt_after(driver, DEREGISTER_WITHIN):
                    _workers.deregister(conn, self.id)
                return
            except Exception as exc:
                failed = exc

        def anew() -> None:
            fresh = _leadership.dedicated(side, autocommit=True)
            try:
                _workers.deregister(fresh, self.id)
            finally:
                _close_quietly(fresh)

        _deadline.interruptible(side)
        try:
            _deadline.call(anew, time.monotonic() + DEREGISTER_WITHIN)
        except Exception as exc:
            log.warning(
                "worker %s could not delete its row of cyclone_workers (%s): the maintenance "
                "leader deletes it once it has been silent for its rescue_after",
                self.id,
                _first_line(exc),
            )
            return
        log.info(
            "worker %s deleted its row of cyclone_workers on a new connection (the heartbeat's %s)",
            self.id,
            "had none" if failed is None else f"failed: {_first_line(failed)}",
        )

    def _free(self) -> dict[str, int]:
        """Jobs to claim now, per queue group.

        When steps are short (a running average under ``SHORT_STEP`` seconds), a worker
        without per-queue limits holds up to ``max(3 * concurrency, SHORT_STEP_BATCH)``
        jobs: the extra ones wait for a step thread, and outcomes are recorded once
        ``concurrency`` jobs are done (see :meth:`_batching`), so each record-and-claim
        statement carries more jobs. Long steps get no such buffer, so they are never
        held back from an idle worker.
        """
        if self._limits is None:
            room = self._capacity() - len(self._inflight)
            return {"*": room} if room > 0 else {}
        total_free = self.concurrency - len(self._inflight)
        if total_free <= 0:
            return {}
        return {
            name: min(total_free, limit - self._busy[name])
            for name, limit in self._limits.items()
            if limit - self._busy[name] > 0
        }

    def _scope(self, queue: str) -> _claim.Scope:
        """The literals of this worker's claim statement for one queue group ("*": all)."""
        scope = self._scopes.get(queue)
        if scope is None:
            scope = self._scopes[queue] = _claim.Scope(
                queues=None if queue == "*" else (queue,),
                workflows=tuple(sorted(self.workflows)),
                kinds=tuple(
                    sorted(
                        k
                        for k in self.steps
                        if (None, k) not in self._gated_kinds or k in self._unlimited_kinds
                    )
                ),
            )
        return scope

    def _capacity(self) -> int:
        """How many jobs this worker holds at most: running, or waiting for a thread."""
        if self._short_steps():
            return max(3 * self.concurrency, SHORT_STEP_BATCH)
        return self.concurrency

    def _short_steps(self) -> bool:
        return self._limits is None and self._step_seconds < SHORT_STEP

    def _batching(self) -> bool:
        """True while short steps are still running beyond ``concurrency``: wait for more."""
        if not self._short_steps() or self._stopping.is_set():
            return False
        executing = len(self._inflight) - self._outcomes.qsize()
        return executing > self.concurrency

    def _stop_now(self) -> bool:
        """Whether a stopping worker should hand its jobs back now (grace over, 2nd signal)."""
        if self._abandon.is_set():
            return True
        deadline = self._stop_deadline
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return True
        self._report_waiting(now)
        return False

    def _report_waiting(self, now: float) -> None:
        """Say every :data:`STOPPING_REPORT` seconds which running jobs a stopping worker
        waits for: with no grace, a step that never returns keeps it up, silently, until
        a second signal."""
        if self._stop_reported is None:
            self._stop_reported = now
            return
        if not self._inflight or now - self._stop_reported < STOPPING_REPORT:
            return
        self._stop_reported = now
        running = sorted(self._inflight.values(), key=lambda job: job.id)
        log.info(
            "worker %s stopping: still waiting for %d running job%s (%s); a second signal "
            "hands them back",
            self.id,
            len(running),
            "" if len(running) == 1 else "s",
            ", ".join(_step_runner.describe(job) for job in running[:5])
            + (", ..." if len(running) > 5 else ""),
        )

    def _loop(self, until_idle: bool) -> bool:
        """Record outcomes and claim, then sleep until a job ends, a NOTIFY, or a poll is due.

        Returns True when it handed jobs back instead of waiting for them (stopping).
        """
        poll_due = 0.0
        woken = True
        # Before the first claim: jobs under a served limit may keep a Rate that the
        # served definitions dropped, which that claim must already check.
        self._adopt_limits()
        # Limited jobs are claimed from keys seen in the claim's snapshot too.
        merges = self._scope("*").merges or bool(self._gated)
        confirmed = not merges
        while True:
            if self._stopping.is_set() and not self._stop_told:
                self._stop_told = True
                self._beat_now.set()  # the heartbeat thread records the stop in its row
            if self._stopping.is_set() and self._stop_now():
                self._hand_back()
                return True
            if self._batching():
                self._wake.wait(min(self.heartbeat_interval, IDLE_WAKE))
                self._wake.clear()
                continue
            for job, outcome in self._take_outcomes():
                self._inflight.pop((job.id, job.lease), None)
                self._busy[job.queue] -= 1
                if not isinstance(outcome, _waits.Parked):
                    self._pending[job.id, job.lease] = (job, outcome)
                    continue
                self._free_slot(job.id, job.lease)
                self._due_unknown = True  # a sleep, or a wait's timeout, falls due later
                if outcome.timed_out is not None:  # recorded as it was decided
                    if outcome.timed_out.retry_in is not None:
                        self.stats.retried += 1
                    else:
                        self.stats.failed += 1
            outcomes = list(self._pending.values())
            if any(
                isinstance(o, _completion.Failure) and o.retry_in is not None for _, o in outcomes
            ):
                self._due_unknown = True  # its retry falls due later
            if self._stopping.is_set() and self._freed and not outcomes:
                self._ring_freed()  # a stopping worker claims nothing that would take them
            claimed: list[_claim.Claimed] = []
            free = {} if self._stopping.is_set() else self._free()
            if not (woken or until_idle or time.monotonic() >= poll_due):
                free = {}
            told = bool(free) and not until_idle and self._told_of_work(outcomes, poll_due)
            if told:
                free = {}  # the successes are recorded alone, the cheaper statement
            # The statement that records successes continues the dependents they make
            # ready that it has room for, and claims in the same snapshot, so it cannot see
            # those it made available instead: claim again when it made some. A drain,
            # which must not stop early, claims again after any success of a step.
            unblocking = until_idle and any(
                job.run_id is not None and isinstance(outcome, _completion.Success)
                for job, outcome in outcomes
            )
            failed = False
            self._delivered = 0
            self._unblocked = 0
            self._contended = 0
            if outcomes or free:
                now = time.monotonic()
                recheck_due = self._recheck_due or now >= poll_due or self._maybe_deaf()
                self._recheck_due = False
                if now >= self._due_at:
                    self._due_at = float("inf")  # this claim takes it: the next is not known
                self._due_unknown = self._due_unknown or recheck_due
                claimed, failed = self._record_and_claim(
                    outcomes,
                    free,
                    deliver=recheck_due,
                    dating=self._due_unknown and not until_idle and self._dates_in_claim(),
                )
                if failed:
                    # It read nothing: the claim after the backoff is the woken one, and a
                    # poll it stood for is still due.
                    self._recheck_due = self._recheck_due or recheck_due
                else:
                    self._heard_on = self._held.listening() if self._held is not None else None
                    if free:
                        self._saw_all = len(claimed) < sum(free.values()) and not (
                            self._delivered or self._unblocked or self._contended
                        )
                    if self._dated is not None:
                        self._due_at = self._dated
                        self._due_unknown = False
                    if free:  # a claim saw what was there; a record alone did not look
                        poll_due = min(time.monotonic() + self.poll_interval, self._due_at)
                if (
                    not until_idle
                    and not failed
                    and time.monotonic() - self._adopted_at >= ADOPT_INTERVAL
                ):
                    self._adopt_limits()
                # A full rate window opens without a NOTIFY: after an empty claim, a
                # worker serving a Rate reads when it opens even if nothing rang.
                if (
                    free
                    and not failed
                    and not until_idle
                    and (self._reads_due_now(claimed, free) or (self._rated and not claimed))
                ):
                    self._due_at = self._next_due()
                    poll_due = min(poll_due, self._due_at)
            for job in claimed:
                self._start(job)
            if self._recorded_until is not None and free and len(claimed) >= sum(free.values()):
                self._stop_waiting()  # no room left: new work need not ring for this worker
            if failed:
                self._saw_all = False
                self._wait_for_database()
                continue
            # A claim that delivered signals woke their wait nodes, in its own snapshot too.
            delivered = self._delivered > 0
            if (
                (unblocking or delivered or self._unblocked > 0)
                and (told or len(claimed) < sum(free.values()))
                and not self._stopping.is_set()
            ):
                woken = True
                continue
            if not self._contended:
                self._contention_looks = 0
            elif self._free() and not self._stopping.is_set():
                # A limited key with room and a due job that this claim could not serve
                # (another worker's claim held it), or with a held run due that the
                # admission skipped (another transaction held it): nothing will ring for
                # it, so claim and admit again shortly rather than at the poll.
                self._contention_looks += 1
                delay = _retry.doubling(CONTENDED_RETRY, CONTENDED_CAP, self._contention_looks)
                if self._outcomes.empty():
                    self._wake.wait(delay)
                self._wake.clear()
                woken = True
                continue
            idle = not self._inflight and not self._pending and not claimed
            if idle and (until_idle or self._stopping.is_set()):
                # A claim over several served keys draws its candidates from its snapshot;
                # a drain ends only after a second one, in a new snapshot, finds none.
                if until_idle and not self._stopping.is_set() and not confirmed:
                    confirmed = True
                    continue
                if until_idle and not self._stopping.is_set() and self._adopt_limits():
                    continue  # the runs it started left steps under earlier limits
                return False
            if claimed or outcomes:
                confirmed = not merges
            if claimed and len(claimed) >= sum(free.values()) and self._free():
                continue  # a full batch: more may be waiting
            # A poll is due only when there is room to claim; a full worker waits for a
            # job to end, never spins.
            room = bool(self._free()) and not self._stopping.is_set()
            if room and self._maybe_deaf():
                # Its connection was lost since its last claim (by another statement): a
                # claim on a new one LISTENs, then reads what a lost NOTIFY would have said.
                woken = self._recheck_due = True
                continue
            timeout = self._idle_timeout(poll_due) if room else IDLE_WAKE
            if room and self._hears and not until_idle:
                if self._wait_for_work():
                    # The last claim before sleeping, after every ring slot settled: it
                    # delivers signals and reads when the next job falls due, as a woken one.
                    woken = self._recheck_due = True
                    continue
                if self._unsettled:
                    timeout = min(timeout, _retry.doubling(SETTLE_RETRY, SETTLE_CAP, self._looks))
            woken = not self._outcomes.empty() or self._wake.wait(timeout)
            self._wake.clear()

    def _wait_for_database(self) -> None:
        """Sleep out the backoff after a failed statement.

        A stop cuts it short when nothing waits for the database (no job in flight, no
        outcome to record), and so do the end of the grace and a second signal.
        """
        delay = backoff_delay(self._db_failures)
        end = time.monotonic() + delay
        while (left := end - time.monotonic()) > 0:
            if self._stopping.is_set() and (
                self._stop_now() or not (self._inflight or self._pending)
            ):
                return
            self._wake.wait(min(left, IDLE_WAKE))
            self._wake.clear()

    def _next_due(self) -> float:
        """When (monotonic) the earliest scheduled job this worker serves falls due.

        Read after a woken or polled claim found nothing: a NOTIFY for a job scheduled
        later, or a poll, costs one more statement, then the worker sleeps until the job
        is due, never in a busy loop. Infinity when nothing is scheduled or on an error.
        """
        assert self._held is not None
        try:
            seconds = _due.seconds_until_next_due(self._held, self._scope("*"))
        except Exception:
            self._due_failures += 1
            log.exception("worker %s could not read when the next job is due", self.id)
            # The claim then, and this read again.
            return time.monotonic() + backoff_delay(self._due_failures)
        self._due_failures = 0
        self._due_unknown = False
        if self._gated or self._admits:
            try:
                gated = _limits_store.seconds_until_gated_due(
                    self._held,
                    self._gated,
                    None,
                    self._served,
                    self._admits,
                    self._paired_rates,
                )
            except Exception:
                log.exception("worker %s could not read when a limited job may start", self.id)
                gated = None
            if gated is not None:
                seconds = gated if seconds is None else min(seconds, gated)
        if seconds is None:
            return float("inf")
        return _due_after(seconds)

    def _wait_for_work(self) -> bool:
        """Record this idle worker as waiting for work; True when it must claim once more.

        Work rings only for recorded workers (see :mod:`cyclone._store.notify`). After a
        new record, a transaction that read no waiter may still hold its ring slot: the
        worker looks again (:data:`SETTLE_RETRY`, doubling) until each slot has been free once,
        then claims (True), and only then sleeps until its poll. A record still fresh is
        renewed halfway through its :data:`WAIT_RECORD`; a lapsed one is made anew. A
        failed record is tried again after :func:`backoff_delay` (first half a second), on
        a new connection that LISTENs again: until then no NOTIFY reaches the worker.
        """
        held = self._held
        assert held is not None
        now = time.monotonic()
        if now < self._record_again_at:
            return False
        try:
            lapses = self._recorded_until
            if lapses is None or now >= lapses:
                self._recorded_until = None
                _notify.mark_waiting(held, self.id, WAIT_RECORD)
                self._recorded_until = now + WAIT_RECORD
                self._unsettled = _notify.ALL_SLOTS
                self._looks = 0
            elif now >= lapses - WAIT_RECORD / 2:
                _notify.mark_waiting(held, self.id, WAIT_RECORD)
                self._recorded_until = now + WAIT_RECORD
            if not self._unsettled:
                return False
            self._unsettled = _notify.unsettled(held, self._unsettled)
            self._looks += 1
        except Exception as exc:
            self._record_failures += 1
            delay = backoff_delay(self._record_failures)
            log.warning(
                "worker %s could not record that it waits (%s); polling, trying again in %.1f s",
                self.id,
                _first_line(exc),
                delay,
            )
            # A new session: a slot's lock taken by a look cut short must not outlive it.
            held.close()
            self._recorded_until = None
            self._unsettled = ()
            self._record_again_at = now + delay
            return False
        self._record_failures = 0
        return not self._unsettled

    def _told_of_work(
        self, outcomes: list[tuple[_claim.Claimed, Outcome]], poll_due: float
    ) -> bool:
        """Whether a claim after recording ``outcomes`` would find nothing new that a
        NOTIFY has not told of: the worker is recorded as waiting for work (the record
        live, every ring slot settled), its last claim saw all there was, no NOTIFY came
        since on the connection that LISTENed then, no poll or due job is due, and the
        outcomes are successes of jobs with no dependent to continue in a claim (a step
        that is an upstream, or a map's item, is recorded by the claim that continues
        it). Work made available since then rings this worker, whose next claim takes it.
        """
        if not outcomes or self._recheck_due or not self._saw_all or self._unsettled:
            return False
        now = time.monotonic()
        if (
            self._recorded_until is None
            or now >= self._recorded_until
            or now >= poll_due
            or self._due_unknown
            or not self._dates_in_claim()
            or self._maybe_deaf()
        ):
            return False
        return all(
            isinstance(outcome, _completion.Success)
            and (job.run_id is None or job.kind not in self._upstream.get(job.workflow or "", ()))
            for job, outcome in outcomes
        )

    def _dates_in_claim(self) -> bool:
        """Whether its claim statement can read when its next job falls due: one claim over
        every queue, and no limited job whose start waits for a slot or a window (those
        have a read of their own, :meth:`_next_due`)."""
        return self._limits is None and not self._gated and not self._admits

    def _reads_due_now(self, claimed: list[_claim.Claimed], free: dict[str, int]) -> bool:
        """Whether to read when the next job falls due after this claim, its statement not
        having read it: after a NOTIFY, a poll or a job scheduled later, once a claim finds
        nothing or leaves room (it saw every job due now). A worker serving limited jobs
        reads it too: a claim that took what a full window or full keys let it take may
        leave jobs waiting on a window that opens with no NOTIFY, while its own jobs run
        on and record nothing to claim after."""
        if not self._due_unknown:
            return False
        return not claimed or len(claimed) < sum(free.values())

    def _maybe_deaf(self) -> bool:
        """Whether a NOTIFY may have been lost: the loop sleeps on its held connection's
        socket, and that connection is not the one that LISTENed at the last claim (it was
        lost and none, or a new one, LISTENs now)."""
        held = self._held
        if held is None or not self._hears_on_held:
            return False
        listening = held.listening()
        return listening is None or listening != self._heard_on

    def _stop_waiting(self) -> None:
        """Remove this worker's record as waiting for work, if it has one."""
        if self._recorded_until is None or self._held is None:
            return
        self._recorded_until = None
        self._unsettled = ()
        try:
            _notify.unmark(self._held, self.id)
        except Exception as exc:
            log.debug("worker %s could not remove its wait record (%s)", self.id, exc)

    def _on_jobs_available(self, _payload: str) -> None:
        self._on_notified()

    def _on_notified(self) -> None:
        self._recheck_due = True
        self._wake.set()

    def _idle_timeout(self, poll_due: float) -> float:
        until_poll = max(0.0, poll_due - time.monotonic())
        return min(until_poll, IDLE_WAKE)

    def _take_outcomes(self) -> list[tuple[_claim.Claimed, Outcome]]:
        taken = []
        while True:
            try:
                taken.append(self._outcomes.get_nowait())
            except queue.Empty:
                return taken

    def _record_and_claim(
        self,
        outcomes: list[tuple[_claim.Claimed, Outcome]],
        free: dict[str, int],
        *,
        deliver: bool = False,
        dating: bool = False,
    ) -> tuple[list[_claim.Claimed], bool]:
        """Record ``outcomes`` and claim into ``free``: (jobs claimed, whether a statement failed).

        Each statement commits on its own. An outcome stays in ``_pending`` until it is
        recorded or refused; after a failure it is tried again (with capped backoff) for
        as long as the worker runs: its job is still heartbeaten, so its lease stays
        valid unless the job is rescued, and then the outcome is refused. Jobs that
        earlier statements claimed are still returned: left unstarted, they would wait
        for a rescue. With ``deliver`` (after a NOTIFY, or when a poll is due), the first
        statement also delivers the signals sent to parked wait nodes: a signal's NOTIFY
        is a doorbell, and a lost one waits for the next poll. With ``dating``, the claim
        over every queue also reads when the next job falls due, into :attr:`_dated`.
        """
        self._dated = None
        successes = [o for _, o in outcomes if isinstance(o, _completion.Success)]
        failures = [o for _, o in outcomes if isinstance(o, _completion.Failure)]
        returned = [o for _, o in outcomes if isinstance(o, _waits.HandBack)]
        claimed: list[_claim.Claimed] = []
        # Before any is settled: a limited job that failed or was handed back frees a slot
        # too. Kept in _freed if a statement below fails, for the round that succeeds.
        for job, _ in outcomes:
            self._free_slot(job.id, job.lease)
        retaken: Counter[tuple[str, str]] = Counter()
        try:
            if failures:
                ended: set[int] = set()
                with self.engine.begin() as conn:
                    recorded = _completion.record_failures(conn, failures, ended)
                self._settle(failures, recorded)
                for failure in failures:
                    if failure.report is not None and failure.job_id in recorded:
                        failure.report(failure.job_id not in ended)
            if returned:
                with self.engine.begin() as conn:
                    handed = _rescue.hand_back(conn, [(o.job_id, o.lease) for o in returned])
                self._settle(returned, handed)
            held = self._held
            assert held is not None, "record_and_claim runs inside _serve"
            # Per-queue room can add up to more than concurrency: cap the total, and
            # start from a different queue each time so none is starved. The first
            # statement also records the successes (limit 0 when there is no room).
            left = self._capacity() - len(self._inflight)
            woke: list[int] = []
            unblocked: list[int] = []
            contended: list[int] = []
            # The limited claim continues no step: a success of a step with dependents
            # may have made them available.
            upstream = (
                {
                    o.job_id
                    for job, o in outcomes
                    if isinstance(o, _completion.Success)
                    and job.run_id is not None
                    and job.kind in self._upstream.get(job.workflow or "", ())
                }
                if self._gated
                else set()
            )
            turns = list(free.items())
            self._claim_turn += 1
            start = self._claim_turn % len(turns) if turns else 0
            carrying = successes
            for name, limit in turns[start:] + turns[:start] or [("*", 0)]:
                if left <= 0 and not carrying:
                    break
                scope = self._scope(name)
                if self._gated and not (scope.workflows or scope.kinds):
                    # Nothing but limited jobs to claim: one statement records and claims.
                    recorded, got = _limits_store.record_and_claim_gated(
                        held,
                        worker_id=self.id,
                        successes=carrying,
                        names=self._gated,
                        queues=scope.queues,
                        served=self._served,
                        limit=min(limit, left),
                        steps=self._gated_steps,
                        paired=self._paired,
                        contended=contended,
                    )
                    unblocked.append(sum(1 for o in carrying if o.job_id in upstream))
                    if carrying:
                        self._settle(carrying, recorded)
                    carrying = []
                    self._take_slots(got, retaken)
                    claimed += got
                    left -= len(got)
                    room = min(limit - len(got), left)
                    if self._unmatched(retaken) and room > 0:
                        # Its claim saw the jobs it recorded still running: claim again for
                        # the slots they freed, rather than ring and wait for its own ring.
                        got = self._claim_limited(held, scope.queues, room, contended, retaken)
                        claimed += got
                        left -= len(got)
                    continue
                dues: list[float | None] | None = [] if dating and name == "*" else None
                room = max(0, min(limit, left))
                if room == 0 and carrying and dues is None and not (deliver and not woke):
                    got = []
                    recorded = _claim.record_jobs(held, successes=carrying, unblocked=unblocked)
                else:
                    recorded, got = _claim.record_and_claim(
                        held,
                        worker_id=self.id,
                        successes=carrying,
                        scope=scope,
                        limit=room,
                        woke=woke,
                        deliver=deliver and not woke,
                        unblocked=unblocked,
                        due=dues,
                    )
                if dues:
                    seconds = dues[0]
                    self._dated = float("inf") if seconds is None else _due_after(seconds)
                if carrying:
                    self._settle(carrying, recorded)
                carrying = []
                claimed += got
                left -= len(got)
                room = min(limit - len(got), left)
                if self._gated and room > 0:
                    queues = None if name == "*" else (name,)
                    got = self._claim_limited(held, queues, room, contended, retaken)
                    claimed += got
                    left -= len(got)
            self._delivered = sum(woke)
            if self._delivered:
                # A claim delivers DELIVER_PER_CLAIM pending signals at most, and nothing
                # rings again for the others: the next claim delivers too, until one wakes
                # none (a bulk of signals would otherwise wait for the poll).
                self._recheck_due = True
            self._unblocked = sum(unblocked)
            if self._child_nodes and (deliver or self._draining):
                # Wake the child nodes whose child runs ended (a run's end rang, or a poll).
                self._delivered += _children.deliver(self.engine)
            if self._unmatched(retaken):
                # Limited jobs left running and this worker did not take all their slots
                # again: one may be for a job it does not take (no room, another queue or
                # kind under the same limit's name): wake the others now, not at their poll.
                _limits_store.ring(held)
            if self._admits:
                # After the outcomes above are recorded (a run they ended frees its slot).
                # An admitted run rings NOTIFY: the next claim, here or elsewhere, starts it.
                # Counted as delivered: the loop claims again at once (a drain too). A key
                # it skipped, held by another transaction, counts as contended.
                self._delivered += _limits_store.admit_runs(
                    self.engine, self._admits, contended=contended
                )
            self._contended = sum(contended)
        except Exception as exc:
            self._db_failures += 1
            log.warning(
                "worker %s could not record or claim (%s); %d outcomes kept, retrying in %.1fs",
                self.id,
                _first_line(exc),
                len(self._pending),
                backoff_delay(self._db_failures),
            )
            return claimed, True
        if self._db_failures:
            log.info("worker %s reaches the database again", self.id)
        self._db_failures = 0
        self._freed.clear()
        return claimed, False

    def _free_slot(self, job_id: int, lease: int) -> None:
        """Note that the job left running: the slot a limited claim gave it is free."""
        slot = self._limited.pop((job_id, lease), None)
        if slot is not None:
            self._freed[slot] += 1

    def _claim_limited(
        self,
        held: _executor.Executor,
        queues: tuple[str, ...] | None,
        limit: int,
        contended: list[int],
        taken: Counter[tuple[str, str]],
    ) -> list[_claim.Claimed]:
        """Claim up to ``limit`` limited jobs of ``queues`` (None: every served queue) in a
        statement of their own, noting the slots they take in ``taken``."""
        got = _limits_store.claim_gated(
            held,
            worker_id=self.id,
            names=self._gated,
            queues=queues,
            served=self._served,
            limit=limit,
            steps=self._gated_steps,
            paired=self._paired,
            contended=contended,
        )
        self._take_slots(got, taken)
        return got

    def _take_slots(self, got: list[_claim.Claimed], taken: Counter[tuple[str, str]]) -> None:
        """Note the slots that a limited claim took, in ``taken`` too."""
        for job in got:
            if job.slot is not None:
                self._limited[job.id, job.lease] = job.slot
                taken[job.slot] += 1

    def _unmatched(self, taken: Counter[tuple[str, str]]) -> bool:
        """Whether a slot freed is one this worker did not take again in ``taken``."""
        return any(n > taken[slot] for slot, n in self._freed.items())

    def _ring_freed(self) -> None:
        """Ring for the slots freed and not rung for yet (a worker that stops claims nothing)."""
        if not self._freed or self._held is None:
            return
        try:
            _limits_store.ring(self._held)
        except Exception as exc:
            log.debug("worker %s could not ring for the slots it freed (%s)", self.id, exc)
        self._freed.clear()

    def _settle(self, outcomes: list[Any], recorded: set[int]) -> None:
        """Count recorded outcomes, log refused ones; neither is pending any more.

        ``recorded`` holds job ids. Two outcomes of one job (an execution and the one
        claimed after its rescue) can meet in one statement; leases only grow, so only
        the newer can hold the job's lease, and the older one is the refused one.
        """
        newest: dict[int, int] = {}
        for outcome in outcomes:
            newest[outcome.job_id] = max(outcome.lease, newest.get(outcome.job_id, 0))
        for outcome in outcomes:
            job, _ = self._pending.pop((outcome.job_id, outcome.lease), (None, None))
            self._limited.pop((outcome.job_id, outcome.lease), None)
            if outcome.job_id not in recorded or outcome.lease < newest[outcome.job_id]:
                self.stats.refused += 1
                log.warning(
                    "worker %s: outcome of %s refused: lease %d is no longer the job's "
                    "(rescued, handed back, retried or cancelled meanwhile)",
                    self.id,
                    _step_runner.describe(job) if job is not None else f"job #{outcome.job_id}",
                    outcome.lease,
                )
            elif isinstance(outcome, _completion.Success):
                self.stats.completed += 1
            elif isinstance(outcome, _waits.HandBack):
                self.stats.handed_back += 1
            elif outcome.retry_in is not None:
                self.stats.retried += 1
            else:
                self.stats.failed += 1

    def _hand_back(self) -> None:
        """Record what has finished, hand back the jobs still running, and stop.

        The jobs become available at once under a new lease (the executions still
        running can no longer record), their attempt not counted.
        """
        for job, outcome in self._take_outcomes():
            self._inflight.pop((job.id, job.lease), None)
            if isinstance(outcome, _waits.Parked):
                self._free_slot(job.id, job.lease)
            else:
                self._pending[job.id, job.lease] = (job, outcome)
        if self._pending:
            _claimed, failed = self._record_and_claim(list(self._pending.values()), {})
            if failed:
                log.error(
                    "worker %s stops with %d outcomes it could not record; their jobs "
                    "will be rescued and run again",
                    self.id,
                    len(self._pending),
                )
        held = [(job.id, job.lease) for job in self._inflight.values()]
        if not held:
            return
        try:
            with self.engine.begin() as conn:
                handed = _rescue.hand_back(conn, held)
        except Exception as exc:
            log.error(
                "worker %s could not hand back %d jobs (%s); they will be rescued",
                self.id,
                len(held),
                _first_line(exc),
            )
            return
        self.stats.handed_back += len(handed)
        log.warning(
            "worker %s handed back %d job%s still running: %s",
            self.id,
            len(handed),
            "" if len(handed) == 1 else "s",
            sorted(handed),
        )

    def _start(self, job: _claim.Claimed) -> None:
        assert self._steps_pool is not None
        self._inflight[job.id, job.lease] = job
        self._busy[job.queue] += 1
        self._steps_pool.submit(job)

    def _execute(self, job: _claim.Claimed) -> None:
        started = time.perf_counter()
        try:
            node = _waits.node_of(self.workflows, job)
            mapped = _fanout.node_of(self.workflows, job)
            parent = _children.node_of(self.workflows, job)
            outcome: Outcome
            if mapped is not None:  # a map node: expanded, parked or collected, never called
                outcome = _fanout.execute(self.engine, self.id, job, mapped)
            elif parent is not None:  # a child node: submits its child run, or reads its end
                outcome = _children.execute(
                    self.engine, self.id, job, parent.child_spec(), self.backoff, self._run_step
                )
            elif node is None:
                outcome = self._run_step(job)
            else:  # a wait or sleep node: it runs, or is parked until its signal or time
                outcome = _waits.execute(
                    self.engine, self.id, job, node, self.backoff, self._run_step
                )
        except BaseException as exc:  # a step that raised SystemExit or KeyboardInterrupt
            outcome = _completion.Failure(
                job.id,
                job.lease,
                {"type": type(exc).__qualname__, "message": str(exc), "attempt": job.attempt},
                None if job.attempt >= job.max_attempts else self.backoff(job.attempt),
            )
        self._step_seconds = 0.8 * self._step_seconds + 0.2 * (time.perf_counter() - started)
        self._outcomes.put((job, outcome))
        self._wake.set()

    def _run_step(self, job: _claim.Claimed) -> _completion.Success | _completion.Failure:
        return _step_runner.execute(
            job, self.engine, self.workflows, self.steps, self.backoff, self.step_context
        )


def _no_op() -> None:
    return None


def _close_quietly(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:
        log.debug("closing a worker connection failed", exc_info=True)


@functools.cache
def _version() -> str:
    """cyclone's installed version, read from its metadata once per process."""
    return importlib.metadata.version("cyclone")
