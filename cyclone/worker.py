"""``Worker``: claims jobs of the workflows and step kinds it knows, runs them, records outcomes.

One loop thread claims in batches (``FOR UPDATE SKIP LOCKED``) and records finished jobs
in the same transaction as the next claim; a thread pool runs the steps. An idle worker
sleeps until ``NOTIFY cyclone_jobs_available`` or its poll interval. Steps run at least
once: a worker that dies mid-step stops heartbeating, and another worker hands its jobs
back after ``rescue_after``.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import timedelta
from types import FrameType
from typing import Any

from sqlalchemy import Engine

from cyclone import (
    _binds,
    _claim,
    _completion,
    _due,
    _executor,
    _fastpath,
    _notify,
    _rescue,
    _retry,
    _sweeper,
    _waits,
    errors,
    schedules,
)
from cyclone.workflow import StandaloneStep, Workflow

log = logging.getLogger("cyclone.worker")

DEFAULT_CONCURRENCY = 4
DEFAULT_POLL_INTERVAL = 5.0
DEFAULT_HEARTBEAT_INTERVAL = timedelta(seconds=5)
DEFAULT_RESCUE_AFTER = timedelta(minutes=1)
DEFAULT_MAINTENANCE_INTERVAL = 1.0
MAX_RECORD_TRIES = 3
SHORT_STEP = 0.01
SHORT_STEP_BATCH = 48
MAINTENANCE_JOIN_TIMEOUT = 10.0
DUE_SLACK = 0.005
"""Seconds added to a scheduled job's due time, so the claim that wakes for it finds it due."""

Outcome = _waits.Outcome


class Worker:
    """Runs the jobs of the given workflows and standalone step kinds.

    Args:
        bind: an Engine or a Client.
        workflows: the workflows whose steps this worker runs.
        steps: the standalone step kinds this worker runs.
        concurrency: how many jobs run at once (threads), over all queues.
        queues: ``{"queue": limit}`` to run only these queues, each with its own limit
            (the total is still capped by ``concurrency``); default: every queue, so a
            run whose step a redeploy moved to another queue still runs.
        poll_interval: seconds between polls when no notification arrives.
        heartbeat_interval: how often running jobs are marked alive.
        rescue_after: a running job whose worker has not beaten for this long is run again.
        backoff: seconds to wait before attempt ``n + 1`` of a step that raised on
            attempt ``n`` (default: exponential from 1 s, capped at 5 min, with jitter).
        sweep: run the retention sweeper from :meth:`run` (one worker at a time sweeps).
        sweep_keep: how long terminal runs and finished jobs are kept when a run has no
            ``retention`` of its own.
        sweep_interval: how often the sweeper runs.
        step_context: called before each step; the context manager it returns is entered
            around the step (a framework's application context, or Django's connection
            housekeeping). An error it raises counts as the step's error.

    :meth:`run` also registers the schedules of ``workflows`` (``wf.schedule(...)``) and
    fires their ticks on a thread of its own; :meth:`drain` does not fire them.
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
        sweep_keep: timedelta = _sweeper.DEFAULT_KEEP,
        sweep_interval: timedelta = _sweeper.DEFAULT_INTERVAL,
        step_context: Callable[[], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.engine: Engine = _binds.engine_of(bind)
        self.workflows: dict[str, Workflow[Any]] = {}
        for wf in workflows:
            if wf.name in self.workflows and self.workflows[wf.name] is not wf:
                raise errors.DefinitionError(f"two workflows named {wf.name!r} given to a Worker")
            wf.plan()
            self.workflows[wf.name] = wf
        self._upstream: dict[str, frozenset[str]] = {
            name: frozenset(dep for node in wf.graph().steps for dep in node.after)
            for name, wf in self.workflows.items()
        }
        self.steps: dict[str, StandaloneStep[Any, Any]] = {}
        for st in steps:
            if st.kind in self.steps and self.steps[st.kind] is not st:
                raise errors.DefinitionError(f"two step kinds named {st.kind!r} given to a Worker")
            self.steps[st.kind] = st
        self.schedules = schedules.collect(self.workflows.values())
        if not self.workflows and not self.steps:
            raise errors.DefinitionError("a Worker needs at least one workflow or step kind")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.concurrency = concurrency
        self.queues: list[str] | None = None
        self._limits: dict[str, int] | None = None
        if queues is not None:
            if not queues or any(limit < 1 for limit in queues.values()):
                raise ValueError("queues= maps queue names to limits >= 1")
            self._limits = dict(queues)
            self.queues = sorted(queues)
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval.total_seconds()
        self.rescue_after = rescue_after
        self.backoff = backoff or _retry.exponential()
        self.sweep = sweep
        self.sweep_keep = sweep_keep
        self.sweep_interval = sweep_interval.total_seconds()
        self.step_context = step_context
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

        self._outcomes: queue.SimpleQueue[tuple[_claim.Claimed, Outcome]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._inflight: dict[int, _claim.Claimed] = {}
        self._busy: Counter[str] = Counter()
        self._pool: ThreadPoolExecutor | None = None
        self._jobs_run = 0
        self._last_heartbeat = 0.0
        self._last_maintenance = 0.0
        self._last_sweep = 0.0
        self._claim_turn = 0
        self._lock = threading.Lock()
        self._record_failures = 0
        self._step_seconds = 1.0
        self._sweeping: threading.Thread | None = None
        self._maintaining: threading.Thread | None = None
        self._held: _fastpath.Held | None = None
        self._recheck_due = True

    def __repr__(self) -> str:
        return (
            f"<cyclone.Worker {self.id} workflows={list(self.workflows)} steps={list(self.steps)}>"
        )

    def drain(self) -> int:
        """Run everything runnable now, including steps unblocked meanwhile; return the count.

        Jobs scheduled for later (a retry's backoff, ``run_at=``) are left for later.
        Runs past their deadline are failed first and last.
        """
        return self._serve(until_idle=True)

    def run(self) -> None:
        """Run jobs until SIGINT/SIGTERM or :meth:`stop`; jobs in flight finish first."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self._serve(until_idle=False)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def stop(self) -> None:
        """Ask :meth:`run` to stop claiming, finish the jobs in flight and return."""
        self._stopping.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.info("worker %s stopping on signal %d", self.id, signum)
        self.stop()

    def _serve(self, *, until_idle: bool) -> int:
        with self._lock:
            self._jobs_run = 0
            unsubscribe = _notify.listener(self.engine).subscribe(
                _notify.JOBS_AVAILABLE, self._on_jobs_available
            )
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="cyclone-step")
            self._held = _fastpath.Held(self.engine)
            scheduler = None
            if self.schedules and not until_idle:
                scheduler = schedules.Scheduler(self.engine, self.schedules, self._stopping)
                scheduler.start()
            try:
                self._maintain(force=True, sweep=not until_idle)
                self._loop(until_idle)
                if until_idle:
                    self._maintain(force=True, sweep=False)
            finally:
                if scheduler is not None:
                    self._stopping.set()
                    scheduler.join(MAINTENANCE_JOIN_TIMEOUT)
                unsubscribe()
                if self._maintaining is not None:
                    self._maintaining.join(MAINTENANCE_JOIN_TIMEOUT)
                self._pool.shutdown(wait=True)
                self._pool = None
                self._held.close()
                self._held = None
                self._stopping.clear()
            return self._jobs_run

    def _free(self) -> dict[str, int]:
        """Jobs to claim now, per queue group.

        When steps are short (a running average under ``SHORT_STEP`` seconds), a worker
        without per-queue limits holds up to ``max(3 * concurrency, SHORT_STEP_BATCH)``
        jobs: the extra ones wait in the pool, and outcomes are recorded once
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
        return _claim.Scope(
            queues=None if queue == "*" else (queue,),
            workflows=tuple(sorted(self.workflows)),
            kinds=tuple(sorted(self.steps)),
        )

    def _capacity(self) -> int:
        """How many jobs this worker holds at most: running, or waiting in the pool."""
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

    def _loop(self, until_idle: bool) -> None:
        """Record outcomes and claim, then sleep until a job ends, a NOTIFY, or a poll is due.

        An idle worker claims again only when woken or after ``poll_interval``; it wakes
        more often than that only to heartbeat and to fail runs past their deadline.
        """
        poll_due = 0.0
        woken = True
        merges = self._scope("*").merges
        confirmed = not merges
        while True:
            if self._batching():
                self._maintain(force=False, sweep=not until_idle)  # heartbeats go on
                self._wake.wait(min(self.heartbeat_interval, DEFAULT_MAINTENANCE_INTERVAL))
                self._wake.clear()
                continue
            outcomes = self._take_outcomes()
            for job, _ in outcomes:
                self._inflight.pop(job.id, None)
                self._busy[job.queue] -= 1
            claimed: list[_claim.Claimed] = []
            free = {} if self._stopping.is_set() else self._free()
            if not (woken or until_idle or time.monotonic() >= poll_due):
                free = {}
            # The statement that records successes claims in the same snapshot, so it cannot
            # see the dependents it unblocks: claim again after a success of a step that
            # has dependents. Serving, a run of an older graph is still covered: its
            # unblocked steps ring NOTIFY. A drain, which must not stop early, always does.
            unblocking = any(
                job.run_id is not None
                and isinstance(outcome, _completion.Success)
                and (until_idle or job.kind in self._upstream.get(job.workflow or "", ()))
                for job, outcome in outcomes
            )
            if outcomes or free:
                recheck_due = self._recheck_due or time.monotonic() >= poll_due
                self._recheck_due = False
                claimed = self._record_and_claim(outcomes, free)
                poll_due = time.monotonic() + self.poll_interval
                if free and not claimed and recheck_due and not until_idle:
                    poll_due = min(poll_due, self._next_due())
            for job in claimed:
                self._start(job)
            if unblocking and len(claimed) < sum(free.values()) and not self._stopping.is_set():
                woken = True
                continue
            if not self._inflight and not claimed and (until_idle or self._stopping.is_set()):
                # A claim over several served keys draws its candidates from its snapshot;
                # a drain ends only after a second one, in a new snapshot, finds none.
                if until_idle and not self._stopping.is_set() and not confirmed:
                    confirmed = True
                    continue
                return
            if claimed or outcomes:
                confirmed = not merges
            if claimed and len(claimed) >= sum(free.values()) and self._free():
                continue  # a full batch: more may be waiting
            self._maintain(force=False, sweep=not until_idle)
            # A poll is due only when there is room to claim; a full worker waits for a
            # job to end (or for its next heartbeat), never spins.
            timeout = (
                self._idle_timeout(poll_due)
                if self._free() and not self._stopping.is_set()
                else min(self.heartbeat_interval, DEFAULT_MAINTENANCE_INTERVAL)
            )
            woken = not self._outcomes.empty() or self._wake.wait(timeout)
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
            log.exception("worker %s could not read when the next job is due", self.id)
            return float("inf")
        if seconds is None:
            return float("inf")
        return time.monotonic() + seconds + DUE_SLACK

    def _on_jobs_available(self, _payload: str) -> None:
        self._recheck_due = True
        self._wake.set()

    def _idle_timeout(self, poll_due: float) -> float:
        until_poll = max(0.0, poll_due - time.monotonic())
        return min(until_poll, self.heartbeat_interval, DEFAULT_MAINTENANCE_INTERVAL)

    def _take_outcomes(self) -> list[tuple[_claim.Claimed, Outcome]]:
        taken = []
        while True:
            try:
                taken.append(self._outcomes.get_nowait())
            except queue.Empty:
                return taken

    def _record_and_claim(
        self, outcomes: list[tuple[_claim.Claimed, Outcome]], free: dict[str, int]
    ) -> list[_claim.Claimed]:
        """Record ``outcomes`` and claim into ``free``; the jobs claimed are returned to start.

        Each statement commits on its own. When one fails, the outcomes it did not record
        go back on the queue for the next cycle, and the jobs that earlier statements
        claimed are still returned: left unstarted, they would wait for a rescue.
        """
        successes = [(j, o) for j, o in outcomes if isinstance(o, _completion.Success)]
        failures = [o for _, o in outcomes if isinstance(o, _completion.Failure)]
        unrecorded: list[tuple[_claim.Claimed, Outcome]] = list(outcomes)
        claimed: list[_claim.Claimed] = []
        try:
            # One autocommit statement records the successes and claims: one round trip
            # and one commit a cycle. Recording twice after an error is harmless: every
            # write is guarded by the job's state, attempt and worker.
            if failures:
                with self.engine.begin() as conn:
                    _completion.record(conn, self.id, (), failures)
                unrecorded = list(successes)
            held = self._held
            assert held is not None, "record_and_claim runs inside _serve"
            # Per-queue room can add up to more than concurrency: cap the total, and
            # start from a different queue each time so none is starved. The first
            # statement also records the successes (limit 0 when there is no room).
            left = self._capacity() - len(self._inflight)
            turns = list(free.items())
            self._claim_turn += 1
            start = self._claim_turn % len(turns) if turns else 0
            for name, limit in turns[start:] + turns[:start] or [("*", 0)]:
                if left <= 0 and not unrecorded:
                    break
                got = _claim.record_and_claim(
                    held,
                    worker_id=self.id,
                    successes=[o for _, o in unrecorded if isinstance(o, _completion.Success)],
                    scope=self._scope(name),
                    limit=max(0, min(limit, left)),
                )
                unrecorded = []
                claimed += got
                left -= len(got)
        except Exception:
            self._jobs_run += len(outcomes) - len(unrecorded)
            # Only a failure to record counts towards giving up on the outcomes.
            self._record_failures = self._record_failures + 1 if unrecorded else 0
            if self._record_failures >= MAX_RECORD_TRIES and unrecorded:
                # These jobs stop heartbeating, so another worker runs them again after
                # rescue_after: at least once still holds, and this worker is not stuck.
                log.exception(
                    "worker %s gives up recording %d outcomes; their jobs will be rescued",
                    self.id,
                    len(unrecorded),
                )
                self._record_failures = 0
                return claimed
            log.exception("worker %s could not record outcomes or claim; retrying", self.id)
            for job, outcome in unrecorded:
                self._inflight[job.id] = job
                self._busy[job.queue] += 1
                self._outcomes.put((job, outcome))
            if not claimed:
                self._stopping.wait(min(1.0, self.poll_interval))
            return claimed
        self._record_failures = 0
        self._jobs_run += len(outcomes)
        return claimed

    def _start(self, job: _claim.Claimed) -> None:
        assert self._pool is not None
        self._inflight[job.id] = job
        self._busy[job.queue] += 1
        self._pool.submit(self._execute, job)

    def _execute(self, job: _claim.Claimed) -> None:
        started = time.perf_counter()
        try:
            node = _waits.node_of(self.workflows, job)
            outcome: Outcome
            if node is None:
                outcome = self._run_step(job)
            else:  # a wait or sleep node: it runs, or is parked until its signal or time
                outcome = _waits.execute(
                    self.engine, self.id, job, node, self.backoff, self._run_step
                )
        except BaseException as exc:  # a step that raised SystemExit or KeyboardInterrupt
            outcome = _completion.Failure(
                job.id,
                job.attempt,
                {"type": type(exc).__qualname__, "message": str(exc), "attempt": job.attempt},
                None if job.attempt >= job.max_attempts else self.backoff(job.attempt),
            )
        self._step_seconds = 0.8 * self._step_seconds + 0.2 * (time.perf_counter() - started)
        self._outcomes.put((job, outcome))
        self._wake.set()

    def _run_step(self, job: _claim.Claimed) -> _completion.Success | _completion.Failure:
        return _executor.execute(
            job, self.engine, self.workflows, self.steps, self.backoff, self.step_context
        )

    def _sweep(self) -> None:
        """One retention sweep, off the loop thread so that heartbeats and claims go on."""
        try:
            runs_deleted, jobs_deleted = _sweeper.sweep(self.engine, self.sweep_keep)
        except Exception:
            log.exception("worker %s retention sweep failed; will try again", self.id)
            return
        if runs_deleted or jobs_deleted:
            log.info("sweeper deleted %d runs and %d jobs", runs_deleted, jobs_deleted)

    def _expire_and_rescue(self) -> None:
        """Fail runs past their deadline and hand back jobs of workers that stopped."""
        try:
            with self.engine.begin() as conn:
                expired = _rescue.expire_runs(conn)
                rescued = _rescue.rescue(conn, self.rescue_after)
        except Exception:
            log.exception("worker %s maintenance failed; will try again", self.id)
            return
        if expired:
            log.info("failed %d runs past their deadline", expired)
        if rescued:
            log.warning("handed back %d jobs of workers that stopped: %s", len(rescued), rescued)

    def _maintain(self, *, force: bool, sweep: bool) -> None:
        now = time.monotonic()
        try:
            if self._inflight and (force or now - self._last_heartbeat >= self.heartbeat_interval):
                with self.engine.begin() as conn:
                    _rescue.heartbeat(conn, self.id, list(self._inflight))
                self._last_heartbeat = now
            if force or now - self._last_maintenance >= DEFAULT_MAINTENANCE_INTERVAL:
                # Off the loop thread, like the sweeper, so that its transaction never holds
                # up a claim or a record; forced (a drain's first and last), it runs here.
                self._last_maintenance = now
                if force:
                    self._expire_and_rescue()
                elif not (self._maintaining and self._maintaining.is_alive()):
                    self._maintaining = threading.Thread(
                        target=self._expire_and_rescue, name="cyclone-maintenance", daemon=True
                    )
                    self._maintaining.start()
            if (
                sweep
                and self.sweep
                and now - self._last_sweep >= self.sweep_interval
                and not (self._sweeping and self._sweeping.is_alive())
            ):
                self._last_sweep = now
                self._sweeping = threading.Thread(
                    target=self._sweep, name="cyclone-sweeper", daemon=True
                )
                self._sweeping.start()
        except Exception:
            log.exception("worker %s maintenance failed; will try again", self.id)
