"""Model-based test: random interleavings of cyclone's operations against real workers.

A hypothesis state machine submits runs of :data:`tests.support.model_proc.WORKFLOW`
(``a -> w -> b -> {c, m}``, ``w`` waiting for the signal ``go``, ``c`` a child node whose
child run, the *kid*, is ``g -> k``: ``g`` a child node of its own whose run, the
*grandkid*, has one gated step ``q``, and ``k`` gated (each child node has two attempts:
the second runs a failed or cancelled child again), ``m`` a map node whose two items
``m0`` and ``m1`` are gated; ``b`` and the kid's ``k`` run under a ``Concurrency(1)``
shared by the runs of a *lane*, ``m1`` to ``m3`` and ``m4`` to ``m6``, and their kids, so
that they contend for one slot) on a database of its own, served by worker processes,
and interleaves: submit and submit_once (new key, same key with the same or another
input, a key freed by a purge), fork (of a run ended or not, with a step to run
again or none, under a new key or an earlier fork's), cancel (cascading to the running
kid and grandkid), retry, retry_all, signals
(by run, by key, ``signal_tx`` committed, rolled back or held open), a day passing for a
run (its deadline and its wait's timeout), a run driven to its child nodes
(``bring_to_child``), its kid or grandkid cancelled, retried or retried in full by its
own handle, set_retention and purges (a run kept while a run of its tree runs), runs of
a lane driven to ``b`` together (``bring_to_lane``: one holds the slot, the others queue),
the side queue (``b``, ``k`` and ``q`` run in a queue of their own) paused and resumed, the
lanes' limit set at runtime (``Client.set_limit``: raised to 2, lowered to 1 or 0),
each gated step (each map item and each child's step among them) finishing or
failing (with attempts left or its last), a step finishing while its run is cancelled,
and workers killed with SIGKILL,
frozen with SIGSTOP, thawed with SIGCONT or stopped with a hand-back of their jobs.
Beside them run the runs of a second, small workflow limited as a whole
(:data:`tests.support.model_proc.SLOT`: at most ``max`` runs in progress per key, two
keys, one gated step ``h``), submitted held and admitted by the workers: submitted (held
or admitted at once), cancelled held or in progress, retried or retried in full once
ended (held again if it never started; in progress if its key has room, else refused),
its ``h`` finishing or failing, forked once ended (in progress if its key has room, else
refused; completed at once with nothing to run), its deadline passing (held or in
progress), the limit's ``max`` set at runtime (raised to 2, lowered to 1 or 0), its
``h`` finishing as the run, or the run held next for its key, is cancelled, or as an
ended run of its key is retried (racing the admission), and its ``h`` lost with a
worker killed or frozen (rescued, or given up: the run fails) or handed back; their model
(:class:`tests.support.run_model.SlotModel`) admits each key's oldest held runs (by when
they were held) up to its room after every operation.
Steps wait at gates the test holds (advisory locks, see
:mod:`tests.support.model_proc`), so nothing here sleeps to synchronise: after every
rule the test *settles* (waits until the database shows that every worker did all it
can: each runnable step claimed and waiting at its gate (a ``b`` or ``k`` whose lane's
slot is held by a running job waits, available: not while the slot is free; a step of
the side queue waits, available, while the queue is paused), each outcome
released recorded, each job of a dead or frozen worker rescued, each map node expanded
or parked for its items (its job ``blocked``, an item's job per element of its list),
each signal sent to a parked wait node delivered, each child node whose child ended
woken, each run past its deadline failed, no run of the limited workflow held while
its key has room), then checks cyclone's invariants (no job of the side queue claimed
once its pause took effect; a lane's freed slot taken by its oldest due step; a lane
running more than its limit's ``max`` only by the jobs it ran when the limit was
lowered: they run on; a key of the limited workflow with more runs in progress than its
``max`` only when the model says it was lowered under them) and compares
every run, its children and their steps with the reference model
(:mod:`tests.support.run_model`),
which accepts every state the workers' moves may end in, in any order. At the end of
each example every gate is released, the workers are stopped, and the at-rest
invariants hold (with the *drained* ones: no job waits on a limit slot left free):
every run has ended, or waits for its signal.

Bounded for CI (``CYCLONE_MODEL_EXAMPLES``, default 8, and ``CYCLONE_MODEL_STEPS``,
default 20: about 30 s); a longer run: ``CYCLONE_MODEL_EXAMPLES=500 CYCLONE_MODEL_STEPS=30
scripts/test tests/test_model.py`` (about 5 s per example).
A failure prints hypothesis's reproduction blob (``@reproduce_failure``) and the
interleaving as hypothesis shrank it; ``CYCLONE_MODEL_DERANDOMIZE=1`` makes the examples
the same from run to run.
"""

from __future__ import annotations

import copy
import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RULE_MARKER,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import cyclone
from cyclone._store import notify as _notify
from tests.conftest import create_database, drop_database, wait_until
from tests.support import invariants, run_model
from tests.support.model_proc import (
    CONCURRENCY,
    DAY,
    EXEC_DDL,
    FORK_PREFIX,
    KID_SUFFIX,
    LANE_NAME,
    SIDE_QUEUE,
    SLOT,
    SLOT_NAME,
    SLOT_PREFIX,
    TAG_SQL,
    WORKFLOW,
    Item,
    gate,
    lane_of,
)
from tests.support.run_model import (
    GRAND_STEP,
    GRAND_STEPS,
    ITEMS,
    KID_NODE,
    KID_STEP,
    KID_STEPS,
    LEVELS,
    LIMITED,
    SLOT_STEP,
    STEPS,
    TERMINAL,
    Expect,
    RunModel,
    SlotModel,
    SlotRun,
    finish_and_cancel_slot,
    finish_and_retry_slot,
    lost_with_worker,
    release_and_cancel,
)

KNOWN_DEFECTS_FIXED: dict[str, bool] = {
    # A cancelled run whose steps all completed (cancelled during its last step) and is
    # then retried goes back to running with steps_remaining 0 and nothing to claim.
    "retry_after_cancel": True,
    # A wait node parked while its run is being cancelled goes back to blocked/available
    # inside the cancelled run.
    "park_after_cancel": True,
    # retry() of a run cancelled while its wait node waited keeps the old timeout.
    "retry_resets_waits": True,
    # An open signal_tx holds the wait node's row lock: the worker recording its run's
    # upstream step waits for it, and stops serving every run.
    "signal_tx_lock": True,
    # A SIGSTOPped maintenance leader keeps the lead: nothing is rescued or expired.
    "frozen_leader": True,
    # An item of a map node that spends its attempts fails the run, but leaves the map
    # node cancelled (as a step not started), where docs/map.md says it fails the node.
    "map_item_fails_node": True,
}
"""Rules (or cases of rules) that reach a defect not yet fixed on main are left out
while its flag is False; the lead switches each on once its fix is merged.
``CYCLONE_MODEL_DEFECTS=all`` (or a comma-separated list of these names) runs those
rules whatever the flags say."""
_forced = os.environ.get("CYCLONE_MODEL_DEFECTS", "")
for _name in KNOWN_DEFECTS_FIXED if _forced == "all" else filter(None, _forced.split(",")):
    assert _name in KNOWN_DEFECTS_FIXED, f"CYCLONE_MODEL_DEFECTS: no flag named {_name!r}"
    KNOWN_DEFECTS_FIXED[_name] = True

EXAMPLES = int(os.environ.get("CYCLONE_MODEL_EXAMPLES", "8"))
STEP_COUNT = int(os.environ.get("CYCLONE_MODEL_STEPS", "20"))
SETTLE_TIMEOUT = 10.0
"""Seconds the workers get to do all they can (rescue takes ~2 s)."""
LOOKAHEAD = 4
"""Gates locked ahead of the last execution seen of each step."""
MAX_RUNS = 6
MAX_SLOT_RUNS = 6
"""Runs of the limited workflow an example submits at most."""
PICK = st.integers(0, 63)
MAX_WORKERS = 3
REPO = Path(__file__).resolve().parents[1]

SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEP_COUNT,
    deadline=None,
    database=None,
    print_blob=True,
    derandomize=os.environ.get("CYCLONE_MODEL_DERANDOMIZE", "1" if os.environ.get("CI") else "0")
    == "1",
    suppress_health_check=list(HealthCheck),
)


RULES_RUN: Counter[str] = Counter()
"""How many times each rule ran (printed at the end: what the examples exercised)."""
CHILD_TRANSITIONS: Counter[str] = Counter()
"""How many times the child node ``c``, the kid and its step ``k`` were seen to move from
one state to another between two checks (printed at the end)."""
MAP_TRANSITIONS: Counter[str] = Counter()
"""How many times the map node ``m`` and its items ``m0``, ``m1`` were seen to move from one
state to another between two checks (printed at the end)."""
SLOT_TRANSITIONS: Counter[str] = Counter()
"""How many times a run of the limited workflow (and its step ``h``) was seen to move from
one state to another between two checks (``held``: not admitted), and ``contended``:
checks that saw a key's slot taken and a run held (printed at the end)."""
LANE_TRANSITIONS: Counter[str] = Counter()
"""How many times ``b`` and ``k`` (under the lane's ``Concurrency(1)``) were seen to move
from one state to another between two checks, ``queued`` its wait for the slot (printed
at the end), and ``contended``: checks that saw a lane's slot held and a step queued."""


def guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """A rule or initializer: the example is broken until the checks after it pass, so a
    failure inside it skips the checks of the tear-down (which would hide it)."""

    @functools.wraps(fn)
    def wrapper(self: ModelMachine, *args: Any, **kwargs: Any) -> None:
        RULES_RUN[fn.__name__] += 1
        given = [*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())]
        self.trace.append(f"{fn.__name__}({', '.join(given)})")
        self.broken = True
        try:
            fn(self, *args, **kwargs)
        except BaseException as e:
            self.note_failure(e)
            raise
        self.broken = False

    return wrapper


def when(
    condition: Callable[[ModelMachine], bool],
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A rule's condition on the model, checked as the rule runs: it does nothing when the
    condition fails.

    Not a hypothesis ``precondition``: the model's state depends on how races went (the
    state a kill left a run in, a fork refused, a child made or not), and a precondition
    reading it lets a replayed prefix offer other rules than the first time, which
    hypothesis rejects as ``FlakyStrategyDefinition``. Preconditions read only what the
    rules alone decide (how many workers live or are frozen).
    """

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def wrapper(self: ModelMachine, *args: Any, **kwargs: Any) -> None:
            if condition(self):
                fn(self, *args, **kwargs)
            else:
                RULES_RUN[f"{fn.__name__}: nothing to do"] += 1

        return wrapper

    return decorate


FIRST_FAILURE: list[str] = []
"""The rules of the first example that failed, as it ran, and its error (printed at the
end: hypothesis shrinks a failure by replaying it, and a race may not fail the same way
twice, or at all, so the shrunk example it prints may be another's, or none)."""


def outcome_of(call: Callable[[], Any]) -> Any:
    """What ``call`` returned, or the name of the cyclone error it raised."""
    try:
        return call()
    except (cyclone.NotFoundError, cyclone.InvalidStateError, cyclone.SubmitConflictError) as e:
        return type(e).__name__


# -- the database and the worker processes ----------------------------------------------


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    state: str = "live"  # live | frozen | killed

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(frozen=True)
class Exec:
    """One execution of a gated step, as its row in ``model_exec`` shows it."""

    tag: str
    step: str
    n: int
    pid: int
    attempt: int
    lease: int
    job_id: int = 0


@dataclass
class Snapshot:
    """What the database shows: runs by tag, their jobs, the executions still at a gate."""

    runs: dict[str, dict[str, Any]]
    jobs: dict[tuple[str, str], dict[str, Any]]
    waiting: list[Exec]
    max_n: dict[tuple[str, str], int]

    def current(self, tag: str, step: str) -> Exec | None:
        """The execution that holds the job of ``step``, if it is running at its gate.

        Told by the lease the job was claimed under, not by the attempt: a rescue does
        not count the attempt, so a worker frozen (its job rescued) and thawed can claim
        the job again under the same attempt while its older execution still waits at
        its gate, and that one must not pass for the new one (which may not have reached
        its gate yet).
        """
        job = self.jobs.get((tag, step))
        if job is None or job["state"] != "running":
            return None
        mine = [
            e
            for e in self.waiting
            if (e.tag, e.step, e.pid, e.job_id, e.lease)
            == (tag, step, job["pid"], job["id"], job["lease"])
        ]
        assert len(mine) <= 1, f"two executions at their gate hold one claim: {mine}"
        return mine[0] if mine else None

    def limit_full(self, job: dict[str, Any]) -> bool:
        """Whether ``job`` is limited and its key has ``max`` jobs running (its slot held:
        by a job at its gate, of a cancelled run too, or of a worker not rescued yet)."""
        if job.get("limit") is None:  # (a snapshot made by hand may not say)
            return False
        running = sum(
            1
            for j in self.jobs.values()
            if j.get("limit") == job["limit"] and j["state"] == "running"
        )
        return bool(running >= job["max"])

    def claimed_while_paused(self, before: set[tuple[int, int]]) -> list[str]:
        """The jobs of a paused queue running under a claim made since the pause took
        effect: not among ``before``, the (id, lease) of the jobs of the queue that ran
        then (they run on). A job claimed again (rescued, handed back) has a new lease."""
        return [
            f"{tag}:{step} claimed while its queue {job['queue']} is paused"
            for (tag, step), job in sorted(self.jobs.items())
            if job["state"] == "running"
            and job.get("paused")
            and (job["id"], job["lease"]) not in before
        ]

    def overtaken(self, before: Snapshot) -> list[str]:
        """The limited jobs claimed since ``before`` (the last check's snapshot) ahead of
        one of their key that waited then and waits still: a key's slot goes to its
        oldest due job (by priority, ``scheduled_at``, id). One that waited at ``before``
        (available, due, its run running) was seen by every claim made since: a claim is
        one statement, and the settle saw that key full, or its queue paused, so none
        under way then had room for it (a claim that finds its key claimed from since its
        snapshot skips it; a pause or a limit set waits for the claims under way).
        Unchanged since (the same lease and ``scheduled_at``, its run running), it was
        passed over."""
        waited = [
            (tag, step, job)
            for (tag, step), job in sorted(self.jobs.items())
            if job.get("limit") is not None
            and job["state"] == "available"
            and not job.get("paused")
            and self.runs[tag]["state"] == "running"
            and (was := before.jobs.get((tag, step))) is not None
            and was["state"] == "available"
            and was["due"]
            and before.runs[tag]["state"] == "running"
            and (was["lease"], was["rank"]) == (job["lease"], job["rank"])
        ]
        broken = []
        for (tag, step), job in sorted(self.jobs.items()):
            if job.get("limit") is None or job["state"] != "running":
                continue
            was = before.jobs.get((tag, step))
            if was is not None and (was["state"], was["id"], was["lease"]) == (
                "running",
                job["id"],
                job["lease"],
            ):
                continue  # it ran then
            broken += [
                f"{tag}:{step} took a slot of {job['limit'][1]} ahead of {t}:{s}, due before it"
                for t, s, other in waited
                if other["limit"] == job["limit"] and other["rank"] < job["rank"]
            ]
        return broken

    def queue_counts(self, queue: str) -> tuple[int, int, int]:
        """The jobs of ``queue`` available and due, available later, and running (as
        ``Client.list_queues`` counts them)."""
        mine = [j for j in self.jobs.values() if j.get("queue") == queue]
        return (
            sum(j["state"] == "available" and bool(j["due"]) for j in mine),
            sum(j["state"] == "available" and not j["due"] for j in mine),
            sum(j["state"] == "running" for j in mine),
        )

    def lane_counts(self) -> dict[str, tuple[int, int]]:
        """Per key of the lanes' limit with a job running or available, how many of each
        (as ``Client.list_limits`` counts them)."""
        counts: dict[str, tuple[int, int]] = {}
        for job in self.jobs.values():
            if job.get("limit") is not None and job["state"] in ("running", "available"):
                running, waiting = counts.get(job["limit"][1], (0, 0))
                if job["state"] == "running":
                    counts[job["limit"][1]] = (running + 1, waiting)
                else:
                    counts[job["limit"][1]] = (running, waiting + 1)
        return counts

    def over_limit(self, before: set[tuple[int, int]]) -> list[str]:
        """The keys running more jobs than their limit's ``max``, beyond the jobs claimed
        before it was last set: ``before``, the (id, lease) of the limit's jobs that ran
        once the change took effect (a lowered limit stops no running job: its key may
        run more than ``max`` until they end, but claims nothing until it has room)."""
        held: dict[tuple[str, str], list[tuple[str, str, dict[str, Any]]]] = {}
        for (tag, step), job in sorted(self.jobs.items()):
            if job.get("limit") is not None and job["state"] == "running":
                held.setdefault(job["limit"], []).append((tag, step, job))
        broken = []
        for (_name, key), running in sorted(held.items()):
            kept = sum((job["id"], job["lease"]) in before for _t, _s, job in running)
            top = running[0][2]["max"]
            if len(running) > max(top, kept):
                names = ", ".join(f"{t}:{s}" for t, s, _j in running)
                broken.append(
                    f"{key} runs {len(running)} jobs ({names}), over its max {top} "
                    f"({kept} of them claimed before it was set)"
                )
        return broken

    def in_progress(self, limit: tuple[str, str]) -> list[str]:
        """The runs of a workflow limit's key in progress: admitted (not held), not ended."""
        return sorted(
            tag
            for tag, run in self.runs.items()
            if run["limit"] == limit and run["state"] == "running" and not run["held"]
        )

    def has_room(self, run: dict[str, Any]) -> bool:
        """Whether the key of the workflow limit of ``run`` has fewer runs in progress
        than its ``max``."""
        return len(self.in_progress(run["limit"])) < int(run["limit_max"])

    def observed_slot(self, tag: str) -> dict[str, str] | None:
        """A run of the limited workflow (``held``: not admitted) and its step."""
        run = self.runs.get(tag)
        if run is None:
            return None
        job = self.jobs.get((tag, SLOT_STEP))
        step = "none" if job is None else job["state"]
        return {
            "run": "held" if run["state"] == "running" and run["held"] else run["state"],
            "started": "no" if run["unstarted"] else "yes",
            SLOT_STEP: "active" if step in ("running", "available") else step,
        }

    def expanded(self, tag: str) -> bool:
        """Whether ``m`` of run ``tag`` has items (they exist only once ``b`` completed)."""
        b = self.jobs.get((tag, "b"))
        return (tag, ITEMS[0]) in self.jobs and b is not None and b["state"] == "completed"

    def observed(self, tag: str) -> dict[str, str] | None:
        run = self.runs.get(tag)
        if run is None:
            return None
        seen = {"run": run["state"]}
        for step in STEPS:
            job = self.jobs.get((tag, step))
            if job is None:
                seen[step] = "no job"
                continue
            state = job["state"]
            if state == "running":
                state = "active"
            elif state == "available" and (job.get("limit") is not None or job.get("paused")):
                state = "queued"  # waiting for its lane's slot (the settle checks it is held)
            elif state == "available":
                state = "parked" if step == "w" and job["later"] else "active"
            elif state == "blocked" and step in ("w", "c") and job["pending"] == 0:
                state = "parked"
            elif state == "blocked" and step == "m" and self.expanded(tag):
                state = "parked"  # waiting for its items (pending: those not completed)
            seen[step] = state
        for i in ITEMS:
            job = self.jobs.get((tag, i))
            seen[i] = "none" if job is None else job["state"]
            if seen[i] in ("running", "available"):
                seen[i] = "active"
        for name, child_tag, steps in (
            ("kid", tag + KID_SUFFIX, KID_STEPS),
            ("grand", tag + KID_SUFFIX * 2, GRAND_STEPS),
        ):
            child = self.runs.get(child_tag)
            seen[name] = child["state"] if child else "none"
            for step in steps:
                job = self.jobs.get((child_tag, step))
                state = "none" if child is None else job["state"] if job else "no job"
                if state == "no job" and child is not None and child["state"] != "running":
                    # A child cancelled before a claim started it never had jobs: its
                    # steps read as cancelled, as the read model says (unstarted.py).
                    state = "cancelled"
                if state == "available" and job and (job.get("limit") or job.get("paused")):
                    state = "queued"  # waiting for its lane's slot, or the queue's resume
                elif state in ("running", "available"):
                    state = "active"
                elif state == "blocked" and step == KID_NODE and job and job["pending"] == 0:
                    state = "parked"  # waiting for its child
                seen[step] = state
        return seen


class Harness:
    """The test's database, its gate connection and the worker processes."""

    def __init__(self, url: sa.URL, logs: Path) -> None:
        self.url = url
        self.engine = sa.create_engine(url, pool_size=5)
        self.gates = psycopg.connect(
            url.set(drivername="postgresql").render_as_string(hide_password=False),
            autocommit=True,
        )
        self.logs = logs
        self.workers: list[WorkerProc] = []
        self.locked: dict[tuple[str, str], int] = {}

    def close(self) -> None:
        self.stop_all()
        self.gates.close()
        self.engine.dispose()

    # workers

    def start_worker(self) -> WorkerProc:
        env = {**os.environ, "CYCLONE_MODEL_URL": self.url.render_as_string(hide_password=False)}
        log = (self.logs / f"worker-{len(self.workers)}-{uuid.uuid4().hex[:6]}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.model_proc"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        worker = WorkerProc(proc)
        self.workers.append(worker)
        return worker

    def wait_serving(self, worker: WorkerProc) -> None:
        """Until the worker's claim loop and leader candidacy are connected."""
        app = f"model-{worker.pid}"

        def connected() -> bool:
            assert worker.proc.poll() is None, f"worker {worker.pid} exited early"
            with self.engine.connect() as conn:
                count = conn.execute(
                    sa.text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                    {"a": app},
                ).scalar_one()
            return bool(count >= 3)

        wait_until(connected, 30, 0.05, f"worker {worker.pid} did not connect")

    def live(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.state == "live"]

    def frozen(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.state == "frozen"]

    def leader_pid(self) -> int | None:
        with self.engine.connect() as conn:
            app = conn.execute(
                sa.text(
                    "SELECT a.application_name FROM cyclone_leader l "
                    "JOIN pg_stat_activity a ON a.pid = l.backend_pid "
                    "WHERE l.expires_at > now() AND a.datname = current_database()"
                )
            ).scalar()
        return int(app.removeprefix("model-")) if app else None

    def in_transaction(self, worker: WorkerProc) -> str | None:
        """What a frozen worker's sessions are doing, if one could hold row locks."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT state, wait_event, left(query, 60) FROM pg_stat_activity "
                    "WHERE application_name = :a"
                ),
                {"a": f"model-{worker.pid}"},
            ).all()
        for state, wait_event, query in rows:
            if state.startswith("idle in transaction") or (
                state == "active" and wait_event != "advisory"
            ):
                return f"{state}: {query}"
        return None

    def freeze(self, worker: WorkerProc) -> bool:
        """SIGSTOP ``worker`` between transactions (a freeze mid-transaction would hold
        its row locks: that is idle_in_transaction_session_timeout's business, not the
        model's). False when it kept catching it inside one."""
        for _ in range(20):
            os.kill(worker.pid, signal.SIGSTOP)
            busy = self.in_transaction(worker)
            if busy is None:
                worker.state = "frozen"
                return True
            os.kill(worker.pid, signal.SIGCONT)
            time.sleep(0.01)  # a pause before the next try, not a wait for a condition
        return False

    def thaw(self, worker: WorkerProc) -> None:
        os.kill(worker.pid, signal.SIGCONT)
        worker.state = "live"

    def kill(self, worker: WorkerProc) -> None:
        worker.proc.kill()
        worker.proc.wait(10)
        worker.state = "killed"

    def stop(self, worker: WorkerProc) -> None:
        """SIGTERM: the worker finishes what runs (nothing, at rest) and exits 0."""
        worker.proc.terminate()
        code = worker.proc.wait(30)
        worker.state = "killed"
        assert code == 0, f"worker {worker.pid} exited with {code}"

    def retire(self, worker: WorkerProc, *, busy: bool) -> None:
        """SIGTERM, and for a worker running steps (which never end by themselves: they
        wait at their gates) a second signal: it hands them back and exits.

        ``busy`` (the last settle's snapshot showed one of its executions at a gate) sends
        it at once. Else it is sent once one shows up at a gate while the worker stops:
        a step claimed after that snapshot (a job rescued from a live worker whose
        heartbeat lapsed on a loaded machine, claimed by this one), which one signal
        would wait for forever. Never to a worker with none at a gate: its first signal
        may have ended run(), which restores the default handlers.
        """
        os.kill(worker.pid, signal.SIGTERM)
        second = busy
        if busy:
            os.kill(worker.pid, signal.SIGINT)  # another signal: two SIGTERMs could merge

        def exited() -> bool:
            nonlocal second
            if worker.proc.poll() is not None:
                return True
            if not second and self.at_gates(worker):
                os.kill(worker.pid, signal.SIGINT)
                second = True
            return False

        wait_until(exited, 30, 0.02, lambda: f"worker {worker.pid} did not exit on SIGTERM")
        worker.state = "killed"
        code = worker.proc.returncode
        assert code == 0, f"worker {worker.pid} exited with {code}"

    def at_gates(self, worker: WorkerProc) -> int:
        """How many executions of ``worker`` wait at their gates now."""
        row = self.gates.execute(
            "SELECT count(*) FROM model_exec WHERE pid = %s AND verdict IS NULL", (worker.pid,)
        ).fetchone()
        assert row is not None
        return int(row[0])

    def stop_all(self) -> None:
        for worker in self.workers:
            if worker.proc.poll() is None:
                os.kill(worker.pid, signal.SIGCONT)
                worker.proc.kill()
                worker.proc.wait(10)
            worker.state = "killed"
        self.workers.clear()

    def now(self) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()

    def begun_before(self, moment: Any) -> list[str]:
        """The workers' transactions (a claim is one statement) begun before ``moment`` and
        not ended, but those waiting at a gate."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT application_name, state, left(query, 60) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name LIKE 'model-%' "
                    "AND state <> 'idle' AND xact_start < :moment "
                    "AND wait_event IS DISTINCT FROM 'advisory'"
                ),
                {"moment": moment},
            ).all()
        return [f"{app} {state}: {query}" for app, state, query in rows]

    def barrier(self) -> None:
        """Until every statement of the workers that began before now has ended: a claim
        under way as the test paused a queue or set a limit read the state before it (a
        worker waiting at a gate, or frozen between transactions, runs none)."""
        moment = self.now()
        wait_until(
            lambda: not self.begun_before(moment),
            SETTLE_TIMEOUT,
            0.01,
            lambda: f"statements begun before the change did not end: {self.begun_before(moment)}",
        )

    # gates

    def lock_gates(self, tag: str, step: str, upto: int) -> None:
        have = self.locked.get((tag, step), 0)
        for n in range(have + 1, upto + 1):
            self.gates.execute("SELECT pg_advisory_lock(%s, %s)", gate(tag, step, n))
        self.locked[tag, step] = max(have, upto)

    def release(self, e: Exec, verdict: str) -> None:
        self.gates.execute(
            "UPDATE model_exec SET verdict = %s WHERE tag = %s AND step = %s AND n = %s",
            (verdict, e.tag, e.step, e.n),
        )
        unlocked = self.gates.execute(
            "SELECT pg_advisory_unlock(%s, %s)", gate(e.tag, e.step, e.n)
        ).fetchone()
        assert unlocked == (True,), e

    def wait_completed(self, e: Exec) -> None:
        """Until the job of ``e`` is completed (polling without pause: the caller races
        what follows it)."""
        query = (
            "SELECT j.state FROM cyclone_jobs j JOIN cyclone_runs r ON r.id = j.run_id "
            f"WHERE {TAG_SQL.format(r='r')} = %s AND j.kind || coalesce(j.item::text, '') = %s"
        )
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while self.gates.execute(query, (e.tag, e.step)).fetchone() == ("running",):
            assert time.monotonic() < deadline, f"{e} not recorded in {SETTLE_TIMEOUT} s"

    # reading and settling

    def snapshot(self) -> Snapshot:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    f"SELECT {TAG_SQL.format(r='r')}, r.state, r.steps_remaining, "
                    "r.deadline <= now(), r.start_at IS NOT NULL, r.parent_waits, "
                    "j.kind || coalesce(j.item::text, ''), j.state, j.pending_deps, "
                    "j.worker_id, j.attempt, j.lease, j.id, "
                    "j.scheduled_at <= now(), j.scheduled_at > now() + interval '1 hour', "
                    "s.payload IS NOT NULL, j.limit_name, j.limit_key, l.max, j.lost, "
                    "j.queue, coalesce(q.paused, false), j.priority, j.scheduled_at, "
                    "r.start_at = 'infinity', r.limit_name, r.limit_key, lr.max "
                    "FROM cyclone_runs r LEFT JOIN cyclone_jobs j ON j.run_id = r.id "
                    "LEFT JOIN cyclone_limits lr ON lr.name = r.limit_name "
                    "LEFT JOIN cyclone_signals s ON s.run_id = r.id AND s.name = 'go' "
                    "LEFT JOIN cyclone_limits l ON l.name = j.limit_name "
                    "LEFT JOIN cyclone_queues q ON q.name = j.queue"
                )
            ).all()
            execs = conn.execute(
                sa.text("SELECT tag, step, n, pid, attempt, lease, job_id, verdict FROM model_exec")
            ).all()
        runs: dict[str, dict[str, Any]] = {}
        jobs: dict[tuple[str, str], dict[str, Any]] = {}
        for (
            tag,
            rstate,
            remaining,
            past,
            start_at,
            parent_waits,
            kind,
            jstate,
            pending,
            wid,
            att,
            lease,
            job_id,
            due,
            later,
            signalled,
            limit_name,
            limit_key,
            limit_max,
            lost,
            queue,
            paused,
            priority,
            scheduled_at,
            held,
            run_limit_name,
            run_limit_key,
            run_limit_max,
        ) in rows:
            runs[tag] = {
                "held": bool(held),
                "limit": None if run_limit_name is None else (run_limit_name, run_limit_key),
                "limit_max": run_limit_max,
                "state": rstate,
                "remaining": remaining,
                "past_deadline": bool(past),
                "unstarted": bool(start_at),
                "signalled": bool(signalled),
                "parent_waits": bool(parent_waits),
            }
            if kind is not None:
                jobs[tag, kind] = {
                    "state": jstate,
                    "pending": pending,
                    "pid": int(wid.split(":")[1]) if wid else None,
                    "attempt": att,
                    "lease": lease,
                    "id": job_id,
                    "due": due,
                    "later": later,
                    "limit": None if limit_name is None else (limit_name, limit_key),
                    "max": limit_max,
                    "lost": lost,
                    "queue": queue,
                    "paused": bool(paused),
                    "rank": (priority, scheduled_at, job_id),
                }
        waiting = [Exec(t, s, n, p, a, le, j) for t, s, n, p, a, le, j, v in execs if v is None]
        max_n: dict[tuple[str, str], int] = {}
        for t, s, n, _p, _a, _le, _j, _v in execs:
            max_n[t, s] = max(n, max_n.get((t, s), 0))
        return Snapshot(runs, jobs, waiting, max_n)

    def unsettled(self, snap: Snapshot, cycling: str | None = None) -> list[str]:
        """What the workers have still to do (nothing when every run is settled). A step
        available within the hour (a wait node looked at again shortly) is still to do,
        but for the run ``cycling``, whose wait node an open signal_tx keeps re-checking."""
        live = {w.pid for w in self.live()}
        todo = []
        for tag, run in snap.runs.items():
            if run["state"] != "running":
                continue
            if run.get("held") and snap.has_room(run):
                # A worker admits it (its next claim's admission, rung by what freed the
                # slot): a held run of a key with room is a wake-up lost.
                todo.append(f"{tag}: held, its key {run['limit'][1]} with room")
            elif run["unstarted"] and not run.get("held"):
                todo.append(f"{tag}: not started")
            if run["past_deadline"]:
                todo.append(f"{tag}: past its deadline, still running")
        for (tag, step), job in snap.jobs.items():
            running = snap.runs[tag]["state"] == "running"
            if job["state"] == "available" and running and snap.limit_full(job):
                pass  # waits for its limit's slot, held by another job of its key
            elif job["state"] == "available" and running and job.get("paused"):
                pass  # waits for its queue's resume (its limit's slot free or not)
            elif job["state"] == "available" and job["due"] and running:
                full = " (its limit's slot free)" if job.get("limit") is not None else ""
                todo.append(f"{tag}:{step} available, not claimed{full}")
            elif job["state"] == "available" and not job["later"] and running and tag != cycling:
                todo.append(f"{tag}:{step} available soon, not claimed")
            # A signal sent to a parked wait node is delivered by a worker's next claim
            # (woken by its NOTIFY): until then the node is still parked.
            parked = (job["state"] == "available" and job["later"]) or (
                job["state"] == "blocked" and job["pending"] == 0
            )
            if step == "w" and parked and running and snap.runs[tag]["signalled"]:
                todo.append(f"{tag}:w parked, its signal stored, not delivered")
            # A child run's end wakes its parked node on a worker's next delivery (woken
            # by cyclone_run_finished, or its poll): until then the node is still parked.
            kid = snap.runs.get(tag + KID_SUFFIX)
            if (
                step in ("c", KID_NODE)
                and job["state"] == "blocked"
                and job["pending"] == 0
                and kid is not None
                and kid["state"] != "running"
                and kid.get("parent_waits")
            ):
                todo.append(f"{tag}:{step} parked, its child {kid['state']}, not woken")
            if job["state"] != "running":
                continue
            if job["pid"] not in live:
                todo.append(f"{tag}:{step} held by stopped worker {job['pid']}, not rescued")
            elif step in ("w", "c", "m", KID_NODE):
                todo.append(f"{tag}:{step} running")
            elif snap.current(tag, step) is None:
                todo.append(f"{tag}:{step} running, not at its gate (outcome not recorded)")
        return todo

    def occupancy(self, snap: Snapshot) -> str:
        """Each worker, its step threads waiting at gates and the jobs it holds (a failure's
        context: a live worker whose threads all wait claims nothing, see CONCURRENCY)."""
        at_gates = Counter(e.pid for e in snap.waiting)
        held = Counter(j["pid"] for j in snap.jobs.values() if j["state"] == "running")
        return ", ".join(
            f"{w.pid} {w.state}: {at_gates[w.pid]}/{CONCURRENCY} threads at gates"
            + (
                " (full: it claims nothing)"
                if w.state == "live" and at_gates[w.pid] >= CONCURRENCY
                else ""
            )
            + f", {held[w.pid]} jobs held"
            for w in self.workers
        )

    def settle(self, context: str = "", cycling: str | None = None) -> Snapshot:
        todo: list[str] = []
        last: list[Snapshot] = []

        def settled() -> Snapshot | None:
            snap = self.snapshot()
            last[:] = [snap]
            for (tag, step), n in snap.max_n.items():
                if self.locked.get((tag, step), 0) < n + LOOKAHEAD:
                    self.lock_gates(tag, step, n + LOOKAHEAD)
            todo[:] = self.unsettled(snap, cycling)
            return None if todo else snap

        def unsettled() -> str:
            return (
                f"the workers did not settle{context}: "
                + "; ".join(todo)
                + f" (leader: {self.leader_pid()}, workers: {self.occupancy(last[0])})"
            )

        snap: Snapshot = wait_until(settled, SETTLE_TIMEOUT, 0.02, unsettled)
        return snap


# -- the state machine ---------------------------------------------------------------------


def unsignalled_by_key(machine: ModelMachine, model: RunModel) -> bool:
    """A run reachable by its key whose signal is not stored yet. A signal_tx held open to
    a run already signalled is left out: the wait node then re-checks every second until
    the duplicate send ends, instead of running on the stored payload (a delay, not a
    wrong outcome; to improve in cyclone/_store/waits.py)."""
    return (
        model.key is not None and machine.keys[model.key] == model.number and model.signal is None
    )


def gated_steps(model: RunModel) -> list[tuple[str, str]]:
    """The (tag, step) of each gated step of a run and its children: ``m``'s items among
    them."""
    return [
        (model.tag, "a"),
        (model.tag, "b"),
        (model.tag + KID_SUFFIX, KID_STEP),
        (model.tag + KID_SUFFIX * 2, GRAND_STEP),
        *((model.tag, i) for i in ITEMS),
    ]


class ModelMachine(RuleBasedStateMachine):
    harness: Harness

    def __init__(self) -> None:
        super().__init__()
        self.h = type(self).harness
        run_model.ITEM_FAILS_NODE["on"] = KNOWN_DEFECTS_FIXED["map_item_fails_node"]
        run_model.SIDE_PAUSED["on"] = False
        self.engine = self.h.engine
        self.runs: dict[int, RunModel] = {}
        self.handles: dict[int, cyclone.Run] = {}
        self.keys: dict[str, int] = {}
        self.alternatives: dict[int, list[RunModel]] = {}
        self.next_number = 1
        self.open_tx: tuple[sa.Connection, Any, int, int, Any] | None = None
        self.broken = False
        self.snap: Snapshot | None = None
        self.focus = 0
        self.seen: dict[int, dict[str, str] | None] = {}
        """What the last check saw of each run (to count the child's transitions)."""
        self.trace: list[str] = []
        """The rules run so far in this example, with their arguments."""
        self.paused = False
        """Whether the side queue (``b``, ``k`` and ``q``) is paused."""
        self.ran_at_pause: set[tuple[int, int]] = set()
        """The (id, lease) of the jobs of the side queue that ran once its pause took
        effect: they run on; any other running while it is paused was claimed since."""
        self.lane_max = 1
        """The lanes' limit's ``max``, as the test last set it."""
        self.lowered = False
        """Whether the test lowered the lanes' limit in this example (its keys may then run
        more than ``max``, for a while: :meth:`Snapshot.over_limit` checks them)."""
        self.ran_at_limit: set[tuple[int, int]] = set()
        """The (id, lease) of the lanes' jobs that ran once the limit's last change took
        effect."""
        self.slot = SlotModel()
        """The runs of the limited workflow (``s<N>``), their keys and the limit's max."""
        self.slot_handles: dict[int, cyclone.Run] = {}
        self.slot_alternatives: list[SlotModel] = []
        """The states a race on the limited runs may have left them in (the check keeps
        the one it sees)."""
        self.next_slot = 1
        self.slot_seen: dict[int, dict[str, str] | None] = {}

    def note_failure(self, e: BaseException) -> None:
        if not FIRST_FAILURE:
            FIRST_FAILURE[:] = [*self.trace, f"-> {type(e).__name__}: {str(e)[:3000]}"]

    # set-up and tear-down

    @initialize(
        runs=st.lists(
            st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=3
        ),
        to_children=st.integers(0, 2),
        to_lane=st.integers(0, 3),
        paused=st.booleans(),
        limited=st.lists(st.tuples(st.integers(0, 1), st.booleans()), max_size=3),
    )
    @guarded
    def start(
        self,
        runs: list[tuple[bool, bool, bool]],
        to_children: int = 0,
        to_lane: int = 0,
        paused: bool = False,
        limited: list[tuple[int, bool]] | None = None,
    ) -> None:
        """Two workers serving, and a first few runs (keyed?, with a deadline?, signalled?),
        the first ``to_children`` of them driven to their child nodes (the kid and the
        grandkid made, its ``q`` at its gate), so that the rules find trees of children
        to act on in a short example, and the next ``to_lane`` to their ``b`` (the first
        three runs share a lane: the second's ``b`` queues for the first's slot), the side
        queue ``paused`` before those (their ``b`` then waits with its slot free); and a few
        runs of the limited workflow (``limited``: key, with a deadline?), the second of
        a key held behind the first."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.text("TRUNCATE cyclone_signals, cyclone_jobs, cyclone_runs, model_exec")
            )
        self.h.gates.execute("SELECT pg_advisory_unlock_all()")
        self.h.locked.clear()
        started = [self.h.start_worker() for _ in range(2)]
        for worker in started:
            self.h.wait_serving(worker)
        client = cyclone.Client(self.engine)  # as an example before this one may have left them
        client.resume_queue(SIDE_QUEUE)
        client.set_limit(LANE_NAME, 1)
        client.set_limit(SLOT_NAME, 1)
        for key, deadline in limited or []:
            self.submit_slot_run(key, deadline)
        for keyed, deadline, signalled in runs:
            model = self.submit_new(keyed, deadline)
            if signalled:
                self.send_signal(model, "run", 1)
        if to_children or to_lane:
            self.settle_and_check()
            for number in sorted(self.runs)[:to_children]:
                self.drive_model(self.runs[number], None, GRAND_STEP)
            if paused:
                self.pause_side_queue.__wrapped__(self, True)  # type: ignore[attr-defined]
                self.settle_and_check()
            for number in sorted(self.runs)[to_children:][:to_lane]:
                self.drive_to_lane(self.runs[number])

    def teardown(self) -> None:
        try:
            if not self.broken:
                self.trace.append("teardown()")
                self.bring_to_rest()
        except BaseException as e:
            self.note_failure(e)
            raise
        finally:
            if self.open_tx is not None:
                self.open_tx[0].close()
            self.h.stop_all()

    def bring_to_rest(self) -> None:
        """Release everything, let the workers finish, stop them, check the rest state."""
        if self.open_tx is not None:
            self.close_signal_tx(commit=False)
        for worker in self.h.frozen():
            self.h.thaw(worker)
        if self.paused:  # its steps would wait for ever
            self.pause_side_queue.__wrapped__(self, False)  # type: ignore[attr-defined]
        if self.lane_max == 0:
            self.set_lane_limit.__wrapped__(self, 1)  # type: ignore[attr-defined]
        if self.slot.max == 0:  # its held runs would wait for ever
            self.set_slot_limit.__wrapped__(self, 1)  # type: ignore[attr-defined]
        for _ in range(100):
            snap = self.h.settle(" while bringing the example to rest")
            self.check(snap)
            current = self.releasable(snap)
            limited = self.slot_releasable(snap)
            if not current and not limited and not self.stale(snap):
                break
            for e in current:
                self.model_of(e.tag).release(e.step, "finish")
            self.expect_runs_of(current)
            for e in limited:
                self.slot.release(slot_number(e.tag), "finish")
            for e in current + limited + self.stale(snap):
                self.h.release(e, "finish")
        else:
            raise AssertionError("the example did not come to rest")
        for worker in self.h.live():
            self.h.stop(worker)
        invariants.check(self.engine, at_rest=True, drained=True)
        snap = self.h.snapshot()
        self.compare(snap)
        for tag, run in snap.runs.items():
            if tag.startswith(SLOT_PREFIX):
                assert run["state"] != "running", f"limited run {tag} is {run} at rest"
                continue
            assert not (KID_SUFFIX in tag and run["state"] == "running"), (
                f"child run {tag} is running at rest"
            )
            if run["state"] == "running":
                w = snap.jobs.get((tag, "w"))
                assert w is not None
                seen = snap.observed(tag)
                assert seen is not None
                assert seen["w"] == "parked", (
                    f"run {tag} is running at rest, and not waiting for its signal: {seen}"
                )
                assert self.model_of(tag).signal is None

    # checks after every rule

    @invariant()
    def settled_and_as_modelled(self) -> None:
        if self.broken:
            return
        self.broken = True  # until the checks pass
        try:
            self.settle_and_check()
        except BaseException as e:
            self.note_failure(e)
            raise
        self.broken = False

    def settle_and_check(self) -> None:
        context, cycling = "", None
        if self.open_tx is not None:
            context = f" (a signal_tx to m{self.open_tx[2]} is open)"
            cycling = f"m{self.open_tx[2]}"
        snap = self.h.settle(context, cycling)
        self.check(snap)

    def check(self, snap: Snapshot) -> None:
        skip: tuple[str, ...] = (invariants.AT_MOST_MAX,) if self.lowered else ()
        if self.slot.over():  # a lowered max stops no run in progress (the model's check)
            skip += (invariants.RUNS_AT_MOST_MAX,)
        invariants.check(self.engine, at_rest=False, skip=skip)
        broken = snap.over_limit(self.ran_at_limit) + snap.claimed_while_paused(self.ran_at_pause)
        if self.snap is not None:
            broken += snap.overtaken(self.snap)
        assert not broken, "; ".join(broken)
        # What an operator reads of the lanes (settled, nothing moves): their max as set,
        # and per key the jobs running and waiting; the side queue, paused or not, and its
        # jobs due, later and running.
        client = cyclone.Client(self.engine)
        (lanes,) = [li for li in client.list_limits() if li.name == LANE_NAME]
        assert (lanes.max, lanes.keys) == (self.lane_max, snap.lane_counts()), lanes
        (slot,) = [li for li in client.list_limits() if li.name == SLOT_NAME]
        assert slot.max == self.slot.max, slot
        side = [
            (q.paused, (q.available, q.scheduled, q.running))
            for q in client.list_queues()
            if q.name == SIDE_QUEUE
        ]
        expected = (self.paused, snap.queue_counts(SIDE_QUEUE))
        # (listed once it has active jobs, or was ever paused)
        assert side == [expected] or (side, expected) == ([], (False, (0, 0, 0))), side
        self.compare(snap)
        self.snap = snap
        if any(j["state"] == "available" and snap.limit_full(j) for j in snap.jobs.values()):
            LANE_TRANSITIONS["contended"] += 1
        if any(
            j["state"] == "available" and j.get("paused") and not snap.limit_full(j)
            for j in snap.jobs.values()
        ):
            LANE_TRANSITIONS["paused, its slot free"] += 1
        if snap.over_limit(set()):
            LANE_TRANSITIONS["over a lowered max"] += 1

    def compare(self, snap: Snapshot) -> None:
        self.compare_slot(snap)
        for number, model in list(self.runs.items()):
            seen = None if model.purged else snap.observed(model.tag)
            views = [seen]
            # While a signal_tx to its run is open (its send not yet known), the parked
            # wait node is looked at again every second: claimed and parked anew.
            tx_open = self.open_tx is not None and self.open_tx[2] == number
            if seen is not None and seen["w"] == "active" and tx_open:
                views.append({**seen, "w": "parked"})
            candidates = self.alternatives.pop(number, None) or [model]
            # A step waiting for its lane's slot is claimed once another run frees it.
            candidates += [p for c in candidates for p in c.promotions()]
            matching = [c for c in candidates if (None if c.purged else c.summary()) in views]
            if not matching and seen is not None:
                matching = [
                    c for c in self.rescued_from_live(snap, candidates) if c.summary() in views
                ]
                RULES_RUN["a job rescued from a live worker (its heartbeat lapsed)"] += bool(
                    matching
                )
            assert matching, f"run {model.tag} is {seen}; the model says " + " or ".join(
                str(c.summary()) for c in candidates
            )
            self.runs[number] = matching[0]
            self.count_transitions(number, seen)

    def compare_slot(self, snap: Snapshot) -> None:
        """The runs of the limited workflow as the model says (which key's held run was
        admitted as a slot freed: the oldest held), or, if the leader rescued a step ``h``
        more often than the model says (its worker's heartbeat lapsed on a loaded
        machine), as the model with those rescues."""
        runs = sorted(self.slot.runs.values(), key=lambda r: r.number)
        seen = {r.tag: snap.observed_slot(r.tag) for r in runs}
        alternatives = self.slot_alternatives or [self.slot]
        self.slot_alternatives = []
        matching = [c for c in alternatives if c.summaries() == seen]
        if not matching:
            for c in alternatives:
                lapsed = c.copy()
                for r in c.runs.values():
                    job = snap.jobs.get((r.tag, SLOT_STEP))
                    if job is not None and r.step.state == "active" and job["lost"] > r.step.lost:
                        lapsed.lose(r.number, job["lost"] - r.step.lost)
                if lapsed != c and lapsed.summaries() == seen:
                    matching.append(lapsed)
            RULES_RUN["a limited run's h rescued from a live worker"] += bool(matching)
        if not matching:
            model = self.slot.summaries()
            wrong = {t: (seen[t], model[t]) for t in seen if seen[t] != model[t]}
            raise AssertionError(
                f"limited runs (seen, the model says): {wrong}; max {self.slot.max}; "
                f"held in order: {[(r.tag, r.key, r.order) for r in runs if r.state == 'held']}"
                + (f"; or any of {len(alternatives)} alternatives" if len(alternatives) > 1 else "")
            )
        self.slot = matching[0]
        for r in runs:
            before = self.slot_seen.get(r.number) or {"run": "none", SLOT_STEP: "none"}
            now = seen[r.tag] or {"run": "purged", SLOT_STEP: "purged"}
            for part in ("run", SLOT_STEP):
                if before[part] != now[part]:
                    SLOT_TRANSITIONS[f"{part}: {before[part]} -> {now[part]}"] += 1
            self.slot_seen[r.number] = now
        if any(self.slot.held(k) and self.slot.in_progress(k) for k in (0, 1)):
            SLOT_TRANSITIONS["contended"] += 1

    def rescued_from_live(self, snap: Snapshot, candidates: list[RunModel]) -> list[RunModel]:
        """The states ``candidates`` may end in if the leader rescued the jobs the
        database shows lost more often than the model says, from a worker the test did
        not stop (its heartbeat lapsed past ``rescue_after`` on a loaded machine): the job
        is available again, so a step of :data:`LIMITED` may find its slot taken by another
        run's step meanwhile. Only read when no candidate matches."""
        ends: dict[str, RunModel] = {}
        for c in candidates:
            rescued = []
            for tag, step in gated_steps(c):
                job = snap.jobs.get((tag, step))
                if job is None or job.get("lost") is None or not c.owns(step):
                    continue
                if c.step(step).state == "active" and job["lost"] > c.step(step).lost:
                    rescued.append(step)
            if rescued:
                for end in lost_with_worker(c, rescued):
                    ends.setdefault(end.key_of_state(), end)
        return list(ends.values())

    def count_transitions(self, number: int, seen: dict[str, str] | None) -> None:
        before = self.seen.get(number) or {}
        for parts, counter in (
            (("c", "kid", *KID_STEPS, "grand", *GRAND_STEPS), CHILD_TRANSITIONS),
            (("m", *ITEMS), MAP_TRANSITIONS),
            (LIMITED, LANE_TRANSITIONS),
        ):
            for part in parts:
                old = before.get(part, "none")
                new = "purged" if seen is None else seen[part]
                if old != new and not (old == "none" and new == "purged"):
                    counter[f"{part}: {old} -> {new}"] += 1
        self.seen[number] = seen

    def model_of(self, tag: str) -> RunModel:
        """The model of run ``tag``, or of the top of its tree for a child run."""
        return self.runs[int(tag.split("/")[0].removeprefix("m"))]

    def expect(self, model: RunModel) -> RunModel:
        """Let the workers move ``model`` (changed by the test): the states their moves
        may end in are its alternatives, the canonical one (returned) its model until
        the checks tell."""
        ends = model.explore()
        self.alternatives[model.number] = ends
        self.runs[model.number] = ends[0]
        return ends[0]

    def expect_runs_of(self, execs: list[Exec]) -> None:
        """:meth:`expect` for the run of each of ``execs`` (changed by the test), once."""
        for number in sorted({self.model_of(e.tag).number for e in execs}):
            self.expect(self.runs[number])

    def expect_any(self, candidates: list[RunModel]) -> None:
        """As :meth:`expect`, for one run that the test may have left in any of
        ``candidates``."""
        ends: dict[str, RunModel] = {}
        for candidate in candidates:
            for end in candidate.explore():
                ends.setdefault(end.key_of_state(), end)
        self.alternatives[candidates[0].number] = list(ends.values())
        self.runs[candidates[0].number] = next(iter(ends.values()))

    def releasable(self, snap: Snapshot) -> list[Exec]:
        """Executions holding their job at a gate, on a live worker."""
        live = {w.pid for w in self.h.live()}
        found = []
        for model in self.runs.values():
            if model.purged:
                continue
            for tag, step in gated_steps(model):
                e = snap.current(tag, step)
                if e is not None and e.pid in live:
                    found.append(e)
        return found

    def stale(self, snap: Snapshot) -> list[Exec]:
        """Executions at a gate on a live worker that no longer hold their job."""
        live = {w.pid for w in self.h.live()}
        current = set(self.releasable(snap)) | set(self.slot_releasable(snap))
        return [e for e in snap.waiting if e.pid in live and e not in current]

    def slot_releasable(self, snap: Snapshot) -> list[Exec]:
        """Executions of ``h`` holding their job at a gate, on a live worker."""
        live = {w.pid for w in self.h.live()}
        found = []
        for run in sorted(self.slot.runs.values(), key=lambda r: r.number):
            e = None if run.purged else snap.current(run.tag, SLOT_STEP)
            if e is not None and e.pid in live:
                found.append(e)
        return found

    def pick_run(self, pick: int) -> RunModel:
        """The run ``pick`` designates (never the run of an open signal_tx).

        Rules draw plain integers, never from lists of what the database shows: which
        worker claims what is not the same from one replay to the next, and a draw
        that depended on it would make hypothesis's replays (and shrinking) fail.
        """
        numbers = sorted(self.runs)
        if self.open_tx is not None:
            numbers = [n for n in numbers if n != self.open_tx[2]]
        if pick % 2 == 0 and self.focus in numbers:
            return self.runs[self.focus]  # often the run of the last rule: defects need a few
        self.focus = numbers[pick // 2 % len(numbers)]
        return self.runs[self.focus]

    def has_runs(self) -> bool:
        return bool(self.runs) and (self.open_tx is None or len(self.runs) > 1)

    # submitting

    def new_run(self, key: str | None, deadline: bool) -> RunModel:
        number = self.next_number
        self.next_number += 1
        model = RunModel(number=number, key=key, v=0, deadline=deadline)
        self.lock_first_gates(model)
        self.runs[number] = model
        if key is not None:
            self.keys[key] = number
        return model

    def lock_first_gates(self, model: RunModel) -> None:
        for tag, step in gated_steps(model):
            self.h.lock_gates(tag, step, LOOKAHEAD)

    @rule(keyed=st.booleans(), deadline=st.booleans())
    @guarded
    def submit(self, keyed: bool, deadline: bool) -> None:
        if len(self.runs) < MAX_RUNS:
            self.submit_new(keyed, deadline)

    def submit_new(self, keyed: bool, deadline: bool) -> RunModel:
        model = self.new_run(f"key-{self.next_number}" if keyed else None, deadline)
        options: dict[str, Any] = {"deadline": DAY} if deadline else {}
        item = Item(tag=model.tag)
        if model.key is None:
            run = WORKFLOW.submit(self.engine, item, **options)
        else:
            run, created = WORKFLOW.submit_once(self.engine, model.key, item, **options)
            assert created
        self.handles[model.number] = run
        return self.expect(model)

    @rule(pick=PICK, same_input=st.booleans())
    @when(lambda self: bool(self.keys))
    @guarded
    def submit_once_again(self, pick: int, same_input: bool) -> None:
        keys = sorted(self.keys)
        key = keys[pick % len(keys)]
        model = self.runs[self.keys[key]]
        if model.purged:
            if len(self.runs) >= MAX_RUNS or key.startswith(FORK_PREFIX):
                return  # a fork's key names its tag: only a fork takes it again
            fresh = self.new_run(key, deadline=False)
            run, created = WORKFLOW.submit_once(self.engine, key, Item(tag=fresh.tag))
            assert created, "a purge frees the key"
            assert run.id != self.handles[model.number].id
            self.handles[fresh.number] = run
            self.expect(fresh)
            return
        item = Item(tag=model.input_tag, v=model.v if same_input else model.v + 1)
        got = outcome_of(lambda: WORKFLOW.submit_once(self.engine, key, item))
        if same_input:
            assert got == (self.handles[model.number], False), got
        else:
            assert got == Expect.CONFLICT, got

    @rule(pick=PICK, rerun=st.sampled_from([None, "a", "w", "b", "c", "m"]), again=st.booleans())
    @when(lambda self: self.has_runs())
    @guarded
    def fork(self, pick: int, rerun: str | None, again: bool) -> None:
        """Fork a run under a new key, or under the key of an earlier fork (``submit_once``
        semantics: the same input returns that fork, another input conflicts)."""
        model = self.pick_run(pick)
        handle = self.handles[model.number]
        steps = [rerun] if rerun else []
        forks = sorted(
            k for k in self.keys if k.startswith(FORK_PREFIX) and not self.runs[self.keys[k]].purged
        )
        refused = model.fork_refused()
        if again and forks:
            key = forks[pick % len(forks)]
            existing = self.runs[self.keys[key]]
            expected: Any = refused
            if refused is None:
                same = existing.input_tag == model.input_tag
                expected = (self.handles[existing.number], False) if same else Expect.CONFLICT
            got = outcome_of(lambda: handle.fork(key, rerun=steps))
            assert got == expected, (model.tag, key, got, expected)
            RULES_RUN["fork: earlier key"] += 1
            return
        if refused is not None:
            got = outcome_of(lambda: handle.fork(f"{FORK_PREFIX}refused", rerun=steps))
            assert got == refused, (model.tag, got, refused)
            return
        if len(self.runs) >= MAX_RUNS:
            return
        number = self.next_number
        self.next_number += 1
        key = f"{FORK_PREFIX}m{number}"
        forked = model.fork(number, key, rerun)
        self.lock_first_gates(forked)
        self.runs[number] = forked
        self.keys[key] = number
        self.focus = number
        run, created = handle.fork(key, rerun=steps)
        assert created, (model.tag, key)
        self.handles[number] = run
        self.expect(forked)
        RULES_RUN["fork: made"] += 1

    # run control

    @rule(pick=PICK)
    @when(lambda self: self.has_runs())
    @guarded
    def cancel(self, pick: int) -> None:
        model = self.pick_run(pick)
        got = outcome_of(self.handles[model.number].cancel)
        assert got == model.cancel(), (model.tag, got)
        self.expect(model)

    def with_child(self, level: str) -> list[int]:
        """The runs whose tree has a child at ``level`` (not the run of an open signal_tx)."""
        return [
            n
            for n, m in sorted(self.runs.items())
            if not m.purged
            and m.child_at(level) is not None
            and (self.open_tx is None or n != self.open_tx[2])
        ]

    def pick_child(self, pick: int, level: str) -> tuple[RunModel, cyclone.Run] | None:
        """A run whose tree has a child at ``level`` (often the run of the last rule), and
        that child's own handle; None when no run has one."""
        numbers = self.with_child(level)
        if not numbers:
            return None
        if not (pick % 2 == 0 and self.focus in numbers):
            self.focus = numbers[pick // 2 % len(numbers)]
        model = self.runs[self.focus]
        (child,) = self.handles[model.number].children()
        if level == "grand":
            (child,) = child.children()
        return model, child

    @rule(pick=PICK, level=st.sampled_from(LEVELS))
    @when(lambda self: bool(self.with_child("kid")))
    @guarded
    def cancel_child(self, pick: int, level: str) -> None:
        """Cancel a run's kid or grandkid by its own handle (with its running child): the
        node waiting for it fails, naming it, and its next attempt runs it again."""
        picked = self.pick_child(pick, level)
        if picked is None:
            return
        model, child = picked
        got = outcome_of(child.cancel)
        assert got == model.cancel_child(level), (model.tag, level, got)
        self.expect(model)
        RULES_RUN[f"cancel_child: {level} {'refused' if got else 'cancelled'}"] += 1

    @rule(pick=PICK, level=st.sampled_from(LEVELS), every_step=st.booleans())
    @when(lambda self: bool(self.with_child("kid")))
    @guarded
    def retry_child(self, pick: int, level: str, every_step: bool) -> None:
        """``retry`` or ``retry_all`` of a run's kid or grandkid by its own handle (its
        parent ended, or not)."""
        picked = self.pick_child(pick, level)
        if picked is None:
            return
        model, child = picked
        got = outcome_of(child.retry_all if every_step else child.retry)
        assert got == model.retry_child(level, every_step=every_step), (model.tag, level, got)
        self.expect(model)
        how = "retry_all" if every_step else "retry"
        RULES_RUN[f"retry_child: {level} {how} {'refused' if got else 'done'}"] += 1

    @rule(pick=PICK, every_step=st.booleans())
    @when(lambda self: self.has_runs())
    @guarded
    def retry(self, pick: int, every_step: bool) -> None:
        model = self.pick_run(pick)
        if (
            not KNOWN_DEFECTS_FIXED["retry_after_cancel"]
            and not every_step
            and model.state == "cancelled"
            and all(s.state == "completed" for s in model.steps.values())
        ):
            return
        handle = self.handles[model.number]
        got = outcome_of(handle.retry_all if every_step else handle.retry)
        expected, alternatives = model.retry_alternatives(every_step=every_step)
        assert got == expected, (model.tag, got)
        self.alternatives[model.number] = alternatives
        self.runs[model.number] = alternatives[0]

    # signals

    def send_signal(self, model: RunModel, how: str, payload: int) -> None:
        expected = model.copy().send(payload) if how == "rollback" else model.send(payload)
        handle = self.handles[model.number]
        key = model.key or ""  # by key only for a keyed run
        if how == "run":
            got = outcome_of(lambda: handle.signal("go", payload))
        elif how == "key":
            got = outcome_of(lambda: WORKFLOW.signal(self.engine, key, "go", payload))
        else:
            with self.engine.connect() as conn:
                tx = conn.begin()
                got = outcome_of(lambda: WORKFLOW.signal_tx(conn, key, "go", payload))
                if how == "commit":
                    tx.commit()
                else:
                    tx.rollback()
        assert got == expected, (model.tag, how, got, expected)
        if how != "rollback":
            self.expect(model)

    @rule(
        pick=PICK,
        how=st.sampled_from(["run", "key", "commit", "rollback"]),
        payload=st.integers(1, 2),
    )
    @when(lambda self: self.has_runs())
    @guarded
    def signal(self, pick: int, how: str, payload: int) -> None:
        model = self.pick_run(pick)
        if how != "run" and (model.key is None or self.keys.get(model.key) != model.number):
            how = "run"
        self.send_signal(model, how, payload)

    @rule(pick=PICK, payload=st.integers(1, 2))
    @when(
        lambda self: (
            KNOWN_DEFECTS_FIXED["signal_tx_lock"]
            and self.open_tx is None
            and any(unsignalled_by_key(self, m) for m in self.runs.values())
        )
    )
    @guarded
    def open_signal_tx(self, pick: int, payload: int) -> None:
        """A signal_tx whose transaction stays open across the next rules."""
        keyed = [n for n, m in sorted(self.runs.items()) if unsignalled_by_key(self, m)]
        model = self.runs[keyed[pick % len(keyed)]]
        self.focus = model.number
        assert model.key is not None
        key = model.key
        conn = self.engine.connect()
        tx = conn.begin()
        got = outcome_of(lambda: WORKFLOW.signal_tx(conn, key, "go", payload))
        expected = model.copy().send(payload)
        self.open_tx = (conn, tx, model.number, payload, got)
        assert got == expected, (model.tag, got, expected)

    @rule(commit=st.booleans())
    @when(lambda self: self.open_tx is not None)
    @guarded
    def close_signal_tx(self, commit: bool) -> None:
        assert self.open_tx is not None
        conn, tx, number, payload, got = self.open_tx
        self.open_tx = None
        model = self.runs[number]
        if commit:
            tx.commit()
            if got is True:  # stored, whatever the run did while the transaction was open
                model.signal = payload
                self.expect(model)
        else:
            tx.rollback()
        conn.close()

    # time, retention and purges

    @rule(pick=PICK)
    @when(lambda self: self.has_runs())
    @guarded
    def a_day_passes(self, pick: int) -> None:
        """A day passes for one run: its deadline (a day after submit) and the timeout of
        its wait (a day after it parked) pass, as if the clock had moved."""
        model = self.pick_run(pick)
        if (
            not KNOWN_DEFECTS_FIXED["retry_resets_waits"]
            and model.state != "running"
            and model.steps["w"].state == "cancelled"
        ):
            return
        alternatives = model.time_passes()
        self.shift_a_day(model.tag)
        self.expect_any(alternatives)

    def shift_a_day(self, tag: str) -> None:
        """Move the deadline and the wait's timeout of run ``tag`` a day back, and ring."""
        with self.engine.begin() as conn:
            shift = {"tag": tag, "day": timedelta(days=1, minutes=1)}
            conn.execute(
                sa.text(
                    "UPDATE cyclone_runs SET deadline = deadline - :day "
                    f"WHERE {TAG_SQL.format(r='cyclone_runs')} = :tag AND deadline IS NOT NULL"
                ),
                shift,
            )
            conn.execute(
                sa.text(
                    "UPDATE cyclone_signals SET wait_until = wait_until - :day "
                    "WHERE payload IS NULL AND run_id = (SELECT id FROM cyclone_runs r "
                    f"WHERE {TAG_SQL.format(r='r')} = :tag)"
                ),
                shift,
            )
            conn.execute(
                sa.text(
                    "UPDATE cyclone_jobs SET scheduled_at = scheduled_at - :day "
                    "WHERE state = 'available' AND scheduled_at > now() AND run_id = "
                    f"(SELECT id FROM cyclone_runs r WHERE {TAG_SQL.format(r='r')} = :tag)"
                ),
                shift,
            )
            conn.execute(sa.select(sa.func.pg_notify(_notify.JOBS_AVAILABLE, "")))

    @rule(pick=PICK)
    @when(lambda self: self.has_runs())
    @guarded
    def keep_no_longer(self, pick: int) -> None:
        model = self.pick_run(pick)
        got = outcome_of(lambda: self.handles[model.number].set_retention(timedelta(0)))
        if model.purged:
            assert got == Expect.NOT_FOUND
        else:
            assert got is None
            model.retention0 = True

    @rule(everything=st.booleans())
    @when(lambda self: self.open_tx is None)
    @guarded
    def purge(self, everything: bool) -> None:
        """Purge every terminal run, or (the sweep's default keep) those kept no longer."""
        older_than = timedelta(0) if everything else timedelta(days=1)
        deleted = cyclone.Client(self.engine).purge_terminal_runs(older_than=older_than)
        # A run of whose tree a child (the kid, or the grandkid below an ended kid) still
        # runs is kept until it ends (its purge would delete the child under its worker);
        # the purge counts the top runs alone, their children going with them.
        doomed = [
            m
            for m in self.runs.values()
            if not m.purged
            and m.state != "running"
            and not m.tree_running()
            and (everything or m.retention0)
        ]
        for m in doomed:
            m.purged = True
        limited = self.slot.purge() if everything else 0  # (kept a day, as they were)
        assert deleted == len(doomed) + limited, (deleted, [m.tag for m in doomed], limited)

    # steps

    def pick_exec(self, pick: int, found: list[Exec]) -> Exec | None:
        """The execution ``pick`` designates, often one of the run of the last rule (a stale
        one may be of a limited run: those come last)."""

        def number(e: Exec) -> int:
            return -1 if e.tag.startswith(SLOT_PREFIX) else self.model_of(e.tag).number

        found = sorted(found, key=lambda e: (number(e) < 0, slot_or_run_number(e.tag), e.step, e.n))
        focused = [e for e in found if number(e) == self.focus]
        if pick % 2 == 0 and focused:
            return focused[pick // 2 % len(focused)]
        if not found:
            return None
        e = found[pick // 2 % len(found)]
        if number(e) >= 0:
            self.focus = number(e)
        return e

    @rule(pick=PICK, verdict=st.sampled_from(["finish", "fail"]))
    @guarded
    def release(self, pick: int, verdict: str) -> None:
        assert self.snap is not None
        e = self.pick_exec(pick, self.releasable(self.snap))
        if e is None:
            return
        model = self.model_of(e.tag)
        model.release(e.step, verdict)
        self.expect(model)
        self.h.release(e, verdict)

    def release_step(self, tag: str, step: str, verdict: str) -> None:
        """Release the execution holding ``step`` of run ``tag`` (scenarios only), then check."""
        assert self.snap is not None
        e = self.snap.current(tag, step)
        assert e is not None, (tag, step, self.snap.waiting)
        assert e in self.releasable(self.snap), (tag, step, e)
        model = self.model_of(tag)
        model.release(step, verdict)
        self.expect(model)
        self.h.release(e, verdict)
        self.settle_and_check()

    @rule(pick=PICK)
    @guarded
    def finish(self, pick: int) -> None:
        """A step finishes (as :meth:`release`, drawn as often again: steps make progress)."""
        self.release.__wrapped__(self, pick, "finish")  # type: ignore[attr-defined]

    @rule(
        pick=PICK,
        then=st.sampled_from([None, "finish", "fail", "exhaust"]),
        level=st.sampled_from(LEVELS),
    )
    @when(lambda self: self.has_runs())
    @guarded
    def bring_to_child(self, pick: int, then: str | None, level: str) -> None:
        """Drive a run to its child node: finish its ``a`` and ``b``, signal its ``w``,
        checking after each, until ``c`` waits for its kid (whose ``g`` waits for the
        grandkid at once), or nothing moves; then the grandkid's ``q`` (``level`` grand),
        or ``k`` once ``q`` finished (``level`` kid), finishes, fails once, fails until
        its attempts are spent, or (None) waits. The rules acting on a child (a cancel, a
        retry, a worker lost) then have one without a long interleaving."""
        if level == "kid":
            self.drive_to(pick, "finish", GRAND_STEP)
            pick = 0  # the same run
        self.drive_to(pick, then, KID_STEP if level == "kid" else GRAND_STEP)

    @rule(
        pick=PICK,
        item=st.sampled_from(ITEMS),
        then=st.sampled_from(["finish", "fail", "exhaust"]),
    )
    @when(lambda self: self.has_runs())
    @guarded
    def bring_to_map(self, pick: int, item: str, then: str) -> None:
        """As :meth:`bring_to_child`, then one of ``m``'s items finishes, fails once or
        spends its attempts (failing the run, its other item running on)."""
        self.drive_to(pick, then, item)

    @rule(pick=PICK, both=st.booleans())
    @when(lambda self: self.has_runs())
    @guarded
    def bring_to_lane(self, pick: int, both: bool) -> None:
        """Drive a run to its ``b`` (finish its ``a``, signal its ``w``) and leave it there:
        claimed, holding its lane's one slot, or queued for it; ``both``: then another run
        of the same lane (the next by number), which so contends with the first for the
        slot. The rules that release, cancel, retry, lose or purge the holder then race
        the slot's next claim."""
        model = self.pick_run(pick)
        self.drive_to_lane(model)
        lane = lane_of(int(model.input_tag.removeprefix("m")))
        others = [
            n
            for n, other in sorted(self.runs.items())
            if lane_of(int(other.input_tag.removeprefix("m"))) == lane
            and n != model.number
            and (self.open_tx is None or n != self.open_tx[2])
        ]
        if both and others:
            later = [n for n in others if n > model.number]
            self.drive_to_lane(self.runs[(later or others)[0]])

    def advance(
        self, model: RunModel, until: str, tries: int, only: str | None = None
    ) -> RunModel | None:
        """Finish ``model``'s held steps (only ``only``, if given) and signal its wait
        node, settling after each, until its step ``until`` is no longer blocked (or it
        ended); the run's model then, or None when nothing was left to do."""
        for _ in range(tries):
            assert self.snap is not None
            if model.purged or model.state != "running" or model.steps[until].state != "blocked":
                break
            held = [
                e
                for e in self.releasable(self.snap)
                if e.tag == model.tag and only in (None, e.step)
            ]
            if held:
                model.release(held[0].step, "finish")
                model = self.expect(model)
                self.h.release(held[0], "finish")
            elif model.steps["w"].state == "parked":
                self.send_signal(model, "run", 1)
            else:
                return None
            self.settle_and_check()
            model = self.runs[model.number]
        return model

    def drive_to_lane(self, model: RunModel) -> None:
        """:meth:`bring_to_lane` for the run ``model`` alone."""
        advanced = self.advance(model, "b", 3, only="a")
        if advanced is not None:
            RULES_RUN[f"bring_to_lane: b {advanced.steps['b'].state}"] += 1

    def drive_to(self, pick: int, then: str | None, step: str) -> None:
        """Drive a run to ``c`` and ``m``, then give ``step`` (``q``, ``k`` or an item)
        ``then``."""
        self.drive_model(self.pick_run(pick), then, step)

    def drive_model(self, model: RunModel, then: str | None, step: str) -> None:
        """:meth:`drive_to` for the run ``model``."""
        advanced = self.advance(model, "c", 4)
        if advanced is None:
            return
        model = advanced
        verdicts = {None: [], "finish": ["finish"], "fail": ["fail"], "exhaust": ["fail"] * 2}
        tag = {
            KID_STEP: model.tag + KID_SUFFIX,
            GRAND_STEP: model.tag + KID_SUFFIX * 2,
        }.get(step, model.tag)
        for verdict in verdicts[then]:
            assert self.snap is not None
            e = self.snap.current(tag, step)
            if model.purged or e is None or e not in self.releasable(self.snap):
                return
            model.release(step, verdict)
            self.expect(model)
            self.h.release(e, verdict)
            RULES_RUN[f"bring_to: {step} {verdict}"] += 1
            self.settle_and_check()
            model = self.runs[model.number]

    @rule(pick=PICK)
    @guarded
    def release_stale(self, pick: int) -> None:
        """An execution whose job moved on (rescued, purged) finishes: nothing changes."""
        assert self.snap is not None
        e = self.pick_exec(pick, self.stale(self.snap))
        if e is not None:
            self.h.release(e, "finish")

    def racing_cancel(self) -> list[Exec]:
        """Executions whose run a cancel may race (not the run of an open signal_tx)."""
        if self.snap is None:
            return []
        return [
            e
            for e in self.releasable(self.snap)
            if (self.open_tx is None or self.model_of(e.tag).number != self.open_tx[2])
            and (KNOWN_DEFECTS_FIXED["park_after_cancel"] or e.step != "a")
        ]

    @rule(pick=PICK, recorded=st.booleans(), whom=st.sampled_from(["run", *LEVELS]))
    @guarded
    def finish_and_cancel(self, pick: int, recorded: bool, whom: str) -> None:
        """Release a step and cancel its run (or the run's kid or grandkid, by its own
        handle, if made) at once, or as soon as the step is recorded completed: the
        cancel races what the workers do next (start ``w``, park it, wake a child node,
        make or retry a child)."""
        e = self.pick_exec(pick, self.racing_cancel())
        if e is None:
            return
        model = self.model_of(e.tag)
        level = None if whom == "run" or model.child_at(whom) is None else whom
        handle = self.handles[model.number]
        if level is not None:
            (handle,) = handle.children()
            if level == "grand":
                (handle,) = handle.children()
        branches = release_and_cancel(model, e.step, "finish", level)
        self.h.release(e, "finish")
        if recorded:
            self.h.wait_completed(e)
        got = outcome_of(handle.cancel)
        alternatives = [m for m, outcome in branches if outcome == got]
        assert alternatives, (model.tag, level, got)
        RULES_RUN[f"finish_and_cancel: {e.step}, {level or 'run'}"] += 1
        self.alternatives[model.number] = alternatives
        self.runs[model.number] = alternatives[0]

    # the side queue and the lanes' limit

    def running_side(self) -> set[tuple[int, int]]:
        """The (id, lease) of the lanes' jobs running now (once the workers' statements
        begun before the change that asks have ended)."""
        self.h.barrier()
        return {
            (j["id"], j["lease"])
            for j in self.h.snapshot().jobs.values()
            if j["state"] == "running" and j["queue"] == SIDE_QUEUE
        }

    @rule(pause=st.booleans())
    @guarded
    def pause_side_queue(self, pause: bool) -> None:
        """Pause the side queue (of ``b``, ``k`` and ``q``), or resume it. While it is
        paused, a step of it that becomes runnable (made, failed with an attempt left,
        rescued, handed back) waits ``queued``, its lane's slot free or not, and one
        running runs on; resumed, a worker claims at once those its lanes have room for.
        Each call says whether it changed anything."""
        client = cyclone.Client(self.engine)
        if pause:
            got = client.pause_queue(SIDE_QUEUE)
            assert got is not self.paused, got
            if not self.paused:
                self.paused = run_model.SIDE_PAUSED["on"] = True
                self.ran_at_pause = self.running_side()
        else:
            got = client.resume_queue(SIDE_QUEUE)
            assert got is self.paused, got
            self.paused = run_model.SIDE_PAUSED["on"] = False
            self.ran_at_pause = set()
        seen = [
            (q.paused, q.paused_at is not None)
            for q in client.list_queues()
            if q.name == SIDE_QUEUE
        ]
        # (listed once it has active jobs, or was ever paused: a resume first in the
        # database's life, with no job of the queue active, finds it unlisted)
        assert seen == [(self.paused, self.paused)] or (seen == [] and not self.paused), seen

    @rule(top=st.sampled_from([2, 0, 1]))
    @guarded
    def set_lane_limit(self, top: int) -> None:
        """Set the lanes' ``Concurrency`` to ``top`` at runtime (``Client.set_limit``): raised,
        a ``b`` or ``k`` queued for its lane's slot takes one at once; lowered, the lane's
        steps running run on, over ``max`` for a while, and none is claimed until the lane
        has room again; 0 holds every lane."""
        client = cyclone.Client(self.engine)
        client.set_limit(LANE_NAME, top)
        self.lowered = self.lowered or top < self.lane_max
        self.lane_max = top
        self.ran_at_limit = self.running_side()
        (limit,) = [li for li in client.list_limits() if li.name == LANE_NAME]
        assert limit.max == top, limit

    # the limited workflow (runs in progress per key)

    def submit_slot_run(self, key: int, deadline: bool) -> None:
        number = self.next_slot
        self.next_slot += 1
        tag = f"{SLOT_PREFIX}{number}"
        self.h.lock_gates(tag, SLOT_STEP, LOOKAHEAD)
        options: dict[str, Any] = {"deadline": DAY} if deadline else {}
        self.slot_handles[number] = SLOT.submit(self.engine, Item(tag=tag, v=key), **options)
        self.slot.submit(number, key, deadline)

    def pick_slot(self, pick: int, fits: Callable[[SlotRun], bool]) -> SlotRun:
        """The limited run ``pick`` designates among those that ``fits`` (among all when
        none does)."""
        runs = sorted(self.slot.runs.values(), key=lambda r: r.number)
        runs = [r for r in runs if fits(r)] or runs
        return runs[pick % len(runs)]

    @rule(key=st.integers(0, 1), deadline=st.booleans())
    @guarded
    def submit_limited(self, key: int, deadline: bool) -> None:
        """Submit a run of the limited workflow: held, then admitted if its key has room."""
        if len(self.slot.runs) < MAX_SLOT_RUNS:
            self.submit_slot_run(key, deadline)

    @rule(pick=PICK)
    @when(lambda self: bool(self.slot.runs))
    @guarded
    def cancel_limited(self, pick: int) -> None:
        """Cancel a limited run, held (it never starts) or in progress (its slot frees:
        the oldest run held of its key is admitted; its ``h`` at its gate runs on)."""
        run = self.pick_slot(pick, lambda r: r.state in ("held", "running"))
        was = run.state
        got = outcome_of(self.slot_handles[run.number].cancel)
        assert got == self.slot.cancel(run.number), (run.tag, was, got)
        RULES_RUN[f"cancel_limited: {was}"] += 1

    @rule(pick=PICK, every_step=st.booleans())
    @when(lambda self: bool(self.slot.runs))
    @guarded
    def retry_limited(self, pick: int, every_step: bool) -> None:
        """``retry`` or ``retry_all`` of a limited run: never started, held again (behind
        those held now); started, in progress if its key has room, else refused."""
        run = self.pick_slot(pick, lambda r: r.state in TERMINAL)
        was = f"{run.state}{'' if run.started else ' never started'}"
        handle = self.slot_handles[run.number]
        got = outcome_of(handle.retry_all if every_step else handle.retry)
        expected = self.slot.retry(run.number, every_step=every_step)
        assert got == expected, (run.tag, was, every_step, got, expected)
        RULES_RUN[f"retry_limited: {was} {'refused' if got else 'done'}"] += 1

    @rule(pick=PICK, verdict=st.sampled_from(["finish", "finish", "fail"]))
    @guarded
    def release_limited(self, pick: int, verdict: str) -> None:
        """A limited run's ``h`` finishes or fails (its last attempt: the run fails, its
        slot frees)."""
        assert self.snap is not None
        found = self.slot_releasable(self.snap)
        if not found:
            return
        e = found[pick % len(found)]
        self.slot.release(slot_number(e.tag), verdict)
        self.h.release(e, verdict)

    def racing_slot(self, pick: int) -> tuple[Exec, int] | None:
        """An execution of ``h`` whose run is in progress, and its run's number."""
        assert self.snap is not None
        found = [
            e
            for e in self.slot_releasable(self.snap)
            if self.slot.runs[slot_number(e.tag)].state == "running"
        ]
        if not found:
            return None
        e = found[pick % len(found)]
        return e, slot_number(e.tag)

    def race(
        self,
        e: Exec,
        recorded: bool,
        call: Callable[[], Any],
        branches: list[tuple[SlotModel, Any]],
    ) -> Any:
        """Release ``e`` (finish) and make ``call`` at once, or once its job is recorded
        completed; the model is then the ``branches`` of the outcome ``call`` returned."""
        self.h.release(e, "finish")
        if recorded:
            self.h.wait_completed(e)
        got = outcome_of(call)
        ends: dict[str, SlotModel] = {}
        for model, outcome in branches:
            if outcome == got:
                ends.setdefault(repr(model.summaries()), model)
        assert ends, (e.tag, got, [outcome for _m, outcome in branches])
        self.slot_alternatives = list(ends.values())
        self.slot = self.slot_alternatives[0]
        return got

    @rule(pick=PICK, recorded=st.booleans(), whom=st.sampled_from(["own", "next"]))
    @guarded
    def finish_and_cancel_limited(self, pick: int, recorded: bool, whom: str) -> None:
        """A limited run's ``h`` finishes while the test cancels the run (``own``: the
        cancel races its completion) or the run held next for its key (``next``: the
        cancel races its admission, start and claim)."""
        picked = self.racing_slot(pick)
        if picked is None:
            return
        e, running = picked
        held = self.slot.held(self.slot.runs[running].key)
        target = held[0].number if whom == "next" and held else running
        branches = finish_and_cancel_slot(self.slot, running, target)
        got = self.race(e, recorded, self.slot_handles[target].cancel, branches)
        whose = "own" if target == running else "next"
        RULES_RUN[f"finish_and_cancel_limited: {whose}, {got}"] += 1

    @rule(pick=PICK, recorded=st.booleans(), every_step=st.booleans())
    @guarded
    def finish_and_retry_limited(self, pick: int, recorded: bool, every_step: bool) -> None:
        """A limited run's ``h`` finishes while the test retries an ended run of its key:
        the retry races the slot's freeing and the admission of the key's next held run."""
        picked = self.racing_slot(pick)
        if picked is None:
            return
        e, running = picked
        key = self.slot.runs[running].key
        ended = [
            r.number
            for r in sorted(self.slot.runs.values(), key=lambda r: r.number)
            if r.key == key and r.state in TERMINAL and not r.purged
        ]
        if not ended:
            return
        target = ended[pick % len(ended)]
        branches = finish_and_retry_slot(self.slot, running, target, every_step=every_step)
        handle = self.slot_handles[target]
        got = self.race(e, recorded, handle.retry_all if every_step else handle.retry, branches)
        RULES_RUN[f"finish_and_retry_limited: {got}, {len(self.slot_alternatives)} ends"] += 1

    @rule(pick=PICK, rerun=st.booleans())
    @when(lambda self: bool(self.slot.runs))
    @guarded
    def fork_limited(self, pick: int, rerun: bool) -> None:
        """Fork an ended limited run (running ``h`` again or not): in progress at once if
        its key has room (refused otherwise), completed at once if it has nothing to
        run."""
        source = self.pick_slot(pick, lambda r: r.state in TERMINAL)
        if len(self.slot.runs) >= MAX_SLOT_RUNS + 2:
            return
        number = self.next_slot
        tag = f"{SLOT_PREFIX}{number}"
        handle = self.slot_handles[source.number]
        expected = self.slot.copy().fork(source.number, number, rerun=rerun)
        if expected is None:
            self.next_slot += 1
            self.h.lock_gates(tag, SLOT_STEP, LOOKAHEAD)
        got = outcome_of(lambda: handle.fork(f"{FORK_PREFIX}{tag}", rerun=["h"] if rerun else []))
        if expected is not None:
            assert got == expected, (source.tag, got, expected)
        else:
            assert got == (got[0], True), (source.tag, got)
            self.slot_handles[number] = got[0]
            self.slot.fork(source.number, number, rerun=rerun)
        RULES_RUN[f"fork_limited: {source.state}, {'refused' if expected else 'made'}"] += 1

    @rule(pick=PICK)
    @when(lambda self: bool(self.slot.runs))
    @guarded
    def a_day_passes_limited(self, pick: int) -> None:
        """A limited run's deadline passes: held or in progress, it fails (an admitted run's
        slot frees, and the leader rings: the next held run is admitted)."""
        run = self.pick_slot(pick, lambda r: r.deadline and not r.deadline_passed)
        if run.purged:
            return
        self.slot.time_passes(run.number)
        self.shift_a_day(run.tag)

    @rule(top=st.sampled_from([2, 0, 1]))
    @guarded
    def set_slot_limit(self, top: int) -> None:
        """Set the limited workflow's ``max`` at runtime: raised, each key admits its
        oldest held runs up to it; lowered, its runs in progress run on (over ``max``), and
        none is admitted until the key has room again; 0 admits none."""
        client = cyclone.Client(self.engine)
        client.set_limit(SLOT_NAME, top)
        self.slot.set_max(top)

    # workers

    def held_by(self, worker: WorkerProc) -> list[Exec]:
        """The executions holding their job at a gate on ``worker`` (live until now)."""
        assert self.snap is not None
        return [e for e in self.releasable(self.snap) if e.pid == worker.pid]

    def slot_held_by(self, worker: WorkerProc) -> list[Exec]:
        """The executions of ``h`` holding their job at a gate on ``worker``."""
        assert self.snap is not None
        return [e for e in self.slot_releasable(self.snap) if e.pid == worker.pid]

    def lose(self, held: list[Exec]) -> None:
        """The model of jobs whose worker died or froze: lost, then rescued."""
        for number in sorted({self.model_of(e.tag).number for e in held}):
            steps = [e.step for e in held if self.model_of(e.tag).number == number]
            self.expect_any(lost_with_worker(self.runs[number], steps))

    @precondition(lambda self: len(self.h.live()) >= 2)
    @rule(pick=PICK)
    @guarded
    def kill_worker(self, pick: int) -> None:
        live = self.h.live()
        worker = live[pick % len(live)]
        self.lose(self.held_by(worker))
        for e in self.slot_held_by(worker):
            self.slot.lose(slot_number(e.tag))
        self.h.kill(worker)

    @precondition(lambda self: len(self.h.live()) >= 2)
    @rule(pick=PICK)
    @guarded
    def retire_worker(self, pick: int) -> None:
        """A worker stops at once (two signals), handing back the jobs it holds."""
        live = self.h.live()
        worker = live[pick % len(live)]
        held = self.held_by(worker)
        for e in held:
            self.model_of(e.tag).hand_back(e.step)
        for e in self.slot_held_by(worker):
            self.slot.hand_back(slot_number(e.tag))
        self.expect_runs_of(held)
        assert self.snap is not None
        self.h.retire(worker, busy=any(e.pid == worker.pid for e in self.snap.waiting))

    @precondition(lambda self: len(self.h.live()) >= 2)
    @rule(pick=PICK)
    @guarded
    def freeze_worker(self, pick: int) -> None:
        """SIGSTOP a worker (while the frozen-leader defect stands, one that does not lead)."""
        live = self.h.live()
        for worker in live[pick % len(live) :] + live[: pick % len(live)]:
            held = self.held_by(worker)
            limited = self.slot_held_by(worker)
            if not self.h.freeze(worker):
                raise AssertionError(f"worker {worker.pid} was always caught in a transaction")
            if KNOWN_DEFECTS_FIXED["frozen_leader"] or self.h.leader_pid() != worker.pid:
                self.lose(held)
                for e in limited:
                    self.slot.lose(slot_number(e.tag))
                return
            self.h.thaw(worker)
        raise AssertionError("every live worker leads")

    def freeze_leader(self) -> None:
        """SIGSTOP the worker that leads maintenance (scenarios only)."""
        leader = wait_until(self.h.leader_pid, 10, 0.05, "no worker leads")
        worker = next(w for w in self.h.live() if w.pid == leader)
        held = self.held_by(worker)
        limited = self.slot_held_by(worker)
        assert self.h.freeze(worker)
        self.lose(held)
        for e in limited:
            self.slot.lose(slot_number(e.tag))

    @precondition(lambda self: bool(self.h.frozen()))
    @rule(pick=PICK)
    @guarded
    def thaw_worker(self, pick: int) -> None:
        frozen = self.h.frozen()
        self.h.thaw(frozen[pick % len(frozen)])

    @precondition(
        lambda self: (
            len(self.h.live()) < MAX_WORKERS
            and sum(w.state != "killed" for w in self.h.workers) < MAX_WORKERS + 1
        )
    )
    @rule()
    @guarded
    def start_worker(self) -> None:
        self.h.wait_serving(self.h.start_worker())


def slot_number(tag: str) -> int:
    """The number of the limited run ``s<N>``."""
    return int(tag.removeprefix(SLOT_PREFIX))


def slot_or_run_number(tag: str) -> int:
    """The number of the limited run ``s<N>``, or of the top run of ``tag``'s tree."""
    return int(tag.split("/")[0].removeprefix("m").removeprefix(SLOT_PREFIX))


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    url = create_database("cyclone_model")
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.text(EXEC_DDL))
    engine.dispose()
    harness = Harness(url, tmp_path)
    try:
        yield harness
    finally:
        harness.close()
        drop_database(url)


@pytest.mark.processes
@pytest.mark.timeout(max(300, EXAMPLES * 60))
def test_random_interleavings_end_as_the_model_says(harness: Harness) -> None:
    ModelMachine.harness = harness
    RULES_RUN.clear()
    CHILD_TRANSITIONS.clear()
    MAP_TRANSITIONS.clear()
    LANE_TRANSITIONS.clear()
    SLOT_TRANSITIONS.clear()
    FIRST_FAILURE.clear()
    started = time.monotonic()
    try:
        run_state_machine_as_test(ModelMachine, settings=SETTINGS)
    finally:
        if FIRST_FAILURE:
            print("the first failing example, as it ran:\n  " + "\n  ".join(FIRST_FAILURE))
        print(f"model: {time.monotonic() - started:.0f} s, rules run: {dict(RULES_RUN)}")
        print(f"child transitions seen: {dict(sorted(CHILD_TRANSITIONS.items()))}")
        print(f"map transitions seen: {dict(sorted(MAP_TRANSITIONS.items()))}")
        print(f"lane transitions seen: {dict(sorted(LANE_TRANSITIONS.items()))}")
        print(f"limited runs' transitions seen: {dict(sorted(SLOT_TRANSITIONS.items()))}")


# -- the test of the test: each known defect, replayed through the machine --------------

SCENARIOS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "retry_after_cancel": [
        ("start", {"runs": [(True, False, True)]}),
        ("finish", {"pick": 0}),  # a; w runs at once (signalled); b waits at its gate
        ("cancel", {"pick": 0}),
        ("finish", {"pick": 0}),  # b completes inside the cancelled run
        ("retry", {"pick": 0, "every_step": False}),
    ],
    "retry_resets_waits": [
        ("start", {"runs": [(True, False, False)]}),
        ("finish", {"pick": 0}),  # a; w waits, its timeout a day away
        ("cancel", {"pick": 0}),
        ("a_day_passes", {"pick": 0}),  # while cancelled
        ("retry", {"pick": 0, "every_step": False}),  # w waits anew, a day again
    ],
    "signal_tx_lock": [
        ("start", {"runs": [(True, False, False)]}),
        ("open_signal_tx", {"pick": 0, "payload": 1}),
        ("finish", {"pick": 0}),  # a: recording it must not wait for the open transaction
        ("close_signal_tx", {"commit": True}),
    ],
    "frozen_leader": [
        ("start", {"runs": [(False, True, False)]}),
        ("freeze_leader", {}),
        ("a_day_passes", {"pick": 0}),  # the run's deadline passes: another worker fails it
    ],
    "map_item_fails_node": [
        ("start", {"runs": [(True, False, True)]}),
        ("finish", {"pick": 0}),  # a; w runs at once (signalled)
        ("finish", {"pick": 0}),  # b: c makes its kid, m expands
        ("release_step", {"tag": "m1", "step": "m0", "verdict": "fail"}),
        ("release_step", {"tag": "m1", "step": "m0", "verdict": "fail"}),  # its last attempt
    ],
}
"""A shortest interleaving reaching each known defect, for the machine to replay alone
(``park_after_cancel`` is a race, left to the random interleavings)."""
SEEN_AS = {
    "retry_after_cancel": "a running run with no step remaining is not left running",
    "retry_resets_waits": r"run m1 is \{'run': 'failed'.*the model says \{'run': 'running'",
    "signal_tx_lock": r"did not settle .*m1:a running, not at its gate",
    "frozen_leader": "m1:a held by stopped worker .*not rescued|m1: past its deadline, still",
    "map_item_fails_node": r"run m1 is \{.*'m': 'cancelled'.*the model says \{.*'m': 'failed'",
}
"""How the checks see each defect: the failure its replay must raise while it stands."""


@pytest.mark.processes
@pytest.mark.parametrize("defect", sorted(SCENARIOS))
def test_the_model_catches_each_known_defect_until_it_is_fixed(
    harness: Harness, defect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With its flag off (the defect stands on main), the replay must fail the checks: the
    model-based test can see it. Once the lead turns the flag on, the replay must pass."""
    fixed = KNOWN_DEFECTS_FIXED[defect]
    monkeypatch.setitem(KNOWN_DEFECTS_FIXED, defect, True)
    ModelMachine.harness = harness
    machine = ModelMachine()

    def replay() -> None:
        try:
            for name, arguments in SCENARIOS[defect]:
                getattr(machine, name)(**arguments)
                machine.settled_and_as_modelled()
        finally:
            machine.teardown()

    if fixed:
        replay()
    else:
        with pytest.raises(AssertionError, match=SEEN_AS[defect]):
            replay()


# -- the test of the test: the harness's own rules ----------------------------------------


def test_an_older_execution_on_the_same_worker_does_not_pass_for_the_one_holding_the_job() -> None:
    """A worker frozen past ``rescue_after`` and thawed, given its job again: same worker,
    same attempt (a rescue does not count it), a newer lease. Until the new execution
    reaches its gate, the job is held by no execution at a gate: the settle must wait."""
    old = Exec("m1", "a", 1, pid=100, attempt=1, lease=1, job_id=7)
    other = Exec("m1", "a", 2, pid=200, attempt=1, lease=3, job_id=7)
    job = {"state": "running", "pid": 100, "attempt": 1, "lease": 5, "id": 7}
    snap = Snapshot(
        runs={"m1": {"state": "running"}},
        jobs={("m1", "a"): job},
        waiting=[old, other],
        max_n={("m1", "a"): 2},
    )
    assert snap.current("m1", "a") is None
    new = Exec("m1", "a", 3, pid=100, attempt=1, lease=5, job_id=7)
    snap.waiting.append(new)
    assert snap.current("m1", "a") == new


def test_an_execution_of_a_job_since_made_again_does_not_pass_for_the_new_jobs() -> None:
    """A map node run again deletes its items and makes them again: the new item's first
    claim has the lease the old item's had, and the old execution may still wait at its
    gate on the same worker (the random-mode failure "two executions at their gate hold
    one claim"). The job's id tells them apart."""
    old = Exec("m2", "m1", 1, pid=100, attempt=1, lease=1, job_id=40)
    job = {"state": "running", "pid": 100, "attempt": 1, "lease": 1, "id": 52}
    snap = Snapshot(
        runs={"m2": {"state": "running"}},
        jobs={("m2", "m1"): job},
        waiting=[old],
        max_n={("m2", "m1"): 1},
    )
    assert snap.current("m2", "m1") is None
    new = Exec("m2", "m1", 2, pid=100, attempt=1, lease=1, job_id=52)
    snap.waiting.append(new)
    assert snap.current("m2", "m1") == new


@pytest.mark.processes
def test_a_job_claimed_again_by_its_thawed_worker_finishes_as_modelled(harness: Harness) -> None:
    """Freeze the worker holding a step (rescued, the other worker claims it), thaw it,
    freeze the other: the thawed worker claims the step again, under the attempt of its
    first execution, still waiting at its gate. Finishing the step must finish the new
    execution, and the model must see it completed (the replay of a random-mode failure:
    the older execution was taken for the new one, and its outcome refused)."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def holder() -> int:
        assert machine.snap is not None
        e = machine.snap.current("m1", "a")
        assert e is not None
        return next(i for i, w in enumerate(machine.h.live()) if w.pid == e.pid)

    try:
        machine.start(runs=[(False, False, False)])
        machine.settled_and_as_modelled()
        first = machine.h.live()[holder()]
        machine.freeze_worker(pick=holder())
        machine.settled_and_as_modelled()
        machine.thaw_worker(pick=0)
        machine.settled_and_as_modelled()
        machine.freeze_worker(pick=holder())
        machine.settled_and_as_modelled()
        assert machine.snap is not None
        e = machine.snap.current("m1", "a")
        assert e is not None
        assert (e.pid, e.n) == (first.pid, 3), machine.snap.waiting
        machine.finish(pick=0)
        machine.settled_and_as_modelled()
        assert machine.model_of("m1").steps["a"].state == "completed"
    finally:
        machine.teardown()


@pytest.mark.processes
def test_a_worker_retired_with_a_step_claimed_after_the_last_settle_hands_it_back(
    harness: Harness,
) -> None:
    """retire_worker tells a busy worker from the snapshot of the last settle. A worker
    whose heartbeat lapses past ``rescue_after`` (SIGSTOP here; a loaded machine in random
    mode) has its job rescued, and the other worker claims it: a step at its gate that the
    snapshot does not show. Retiring that worker must still end it (one SIGTERM alone
    waits for the step forever), handing the step back."""
    ModelMachine.harness = harness
    machine = ModelMachine()
    try:
        machine.start(runs=[(False, False, False)])
        machine.settled_and_as_modelled()
        assert machine.snap is not None
        e = machine.snap.current("m1", "a")
        assert e is not None
        holder = next(w for w in harness.live() if w.pid == e.pid)
        other = next(w for w in harness.live() if w is not holder)
        assert harness.freeze(holder)

        def claimed_by_other() -> bool:
            now = harness.snapshot().current("m1", "a")
            return now is not None and now.pid == other.pid

        wait_until(claimed_by_other, 30, 0.05, "the other worker did not claim the rescued job")
        harness.thaw(holder)
        assert not any(w.pid == other.pid for w in machine.snap.waiting)  # idle, it says
        machine.retire_worker(pick=harness.live().index(other))
        assert other.state == "killed"
        machine.settled_and_as_modelled()  # the holder claims the step handed back
        assert machine.snap.current("m1", "a") is not None
    finally:
        machine.teardown()


def test_a_parked_wait_node_whose_signal_is_stored_is_not_settled() -> None:
    """A signal sent to a parked wait node is delivered by a worker's next claim: until
    then the node is parked with its signal stored, and the settle must wait for it."""
    harness = Harness.__new__(Harness)  # no database: unsettled() reads the snapshot only
    harness.workers = []
    parked = {"state": "available", "pending": 0, "pid": None, "attempt": 0, "lease": 2}
    snap = Snapshot(
        runs={
            "m1": {"state": "running", "unstarted": False, "past_deadline": False},
        },
        jobs={
            ("m1", "a"): {"state": "completed", "pending": 0, "due": False, "later": False},
            ("m1", "w"): {**parked, "due": False, "later": True},
            ("m1", "b"): {"state": "blocked", "pending": 1, "due": False, "later": False},
        },
        waiting=[],
        max_n={("m1", "a"): 1},
    )
    snap.runs["m1"]["signalled"] = False
    assert harness.unsettled(snap) == []
    snap.runs["m1"]["signalled"] = True
    assert harness.unsettled(snap) == ["m1:w parked, its signal stored, not delivered"]


def test_a_child_node_parked_for_a_child_run_that_ended_is_not_settled() -> None:
    """A child run's end wakes its parked node on a worker's next delivery: until then the
    node is parked and its child ended, and the settle must wait for the wake (the
    run's ``c`` for its kid, the kid's ``g`` for the grandkid)."""
    harness = Harness.__new__(Harness)  # no database: unsettled() reads the snapshot only
    harness.workers = []
    done = {"state": "completed", "pending": 0, "due": False, "later": False}
    parked = {"state": "blocked", "pending": 0, "due": False, "later": False}
    running = {"state": "running", "unstarted": False, "past_deadline": False}
    kid = {**running, "parent_waits": True}
    grand = {**running, "parent_waits": True}
    snap = Snapshot(
        runs={"m1": dict(running), "m1/kid": kid, "m1/kid/kid": grand},
        jobs={
            ("m1", "a"): done,
            ("m1", "w"): done,
            ("m1", "b"): done,
            ("m1", "c"): parked,
            ("m1/kid", "g"): parked,
            ("m1/kid", "k"): {"state": "blocked", "pending": 1, "due": False, "later": False},
            ("m1/kid/kid", "q"): done,
        },
        waiting=[],
        max_n={},
    )
    snap.runs["m1"]["signalled"] = True
    assert harness.unsettled(snap) == []
    grand["state"] = "failed"
    assert harness.unsettled(snap) == ["m1/kid:g parked, its child failed, not woken"]
    grand["parent_waits"] = False  # woken: g's attempt failed, the next retried it
    grand["state"] = "running"
    kid["state"] = "failed"
    assert harness.unsettled(snap) == ["m1:c parked, its child failed, not woken"]
    assert snap.observed("m1") == {
        "run": "running",
        "a": "completed",
        "w": "completed",
        "b": "completed",
        "c": "parked",
        "kid": "failed",
        "g": "parked",
        "k": "blocked",
        "grand": "running",
        "q": "completed",
        "m": "no job",
        "m0": "none",
        "m1": "none",
    }
    kid["parent_waits"] = False  # woken: the node (claimed) stops waiting as it records
    assert harness.unsettled(snap) == []


def test_a_step_waiting_for_its_lanes_slot_is_settled_only_while_the_slot_is_held() -> None:
    """A ``b`` available and not claimed waits for its lane's slot: settled while a job of
    its limit and key runs (another run's ``b``, a kid's ``k``, or a job of a cancelled
    run still at its gate), read as ``queued``; once no job of its key runs, a lost
    wake-up, and the settle says the slot is free. A job of another key does not hold
    it."""
    harness = Harness.__new__(Harness)  # no database: unsettled() reads the snapshot only
    harness.workers = [WorkerProc(SimpleNamespace(pid=100))]  # type: ignore[arg-type]
    done = {"state": "completed", "pending": 0, "due": False, "later": False}
    lane0, lane1 = ("model.lane", "lane-0"), ("model.lane", "lane-1")
    waiting = {"state": "available", "pending": 0, "pid": None, "attempt": 0, "lease": 0}
    waiting |= {"due": True, "later": False, "limit": lane0, "max": 1}
    holder = {"state": "running", "pending": 0, "pid": 100, "attempt": 1, "lease": 3, "id": 9}
    holder |= {"due": True, "later": False, "limit": lane0, "max": 1}
    running = {"state": "running", "unstarted": False, "past_deadline": False}
    snap = Snapshot(
        runs={"m2": dict(running), "m1/kid": dict(running), "m4": dict(running)},
        jobs={
            ("m2", "a"): done,
            ("m2", "w"): done,
            ("m2", "b"): waiting,
            ("m1/kid", "k"): holder,
            ("m4", "b"): {**holder, "limit": lane1, "id": 10},
        },
        waiting=[
            Exec("m1/kid", "k", 1, pid=100, attempt=1, lease=3, job_id=9),
            Exec("m4", "b", 1, pid=100, attempt=1, lease=3, job_id=10),
        ],
        max_n={},
    )
    for r in snap.runs.values():
        r["signalled"] = True
    assert harness.unsettled(snap) == []
    seen = snap.observed("m2")
    assert seen is not None
    assert seen["b"] == "queued"
    holder["state"] = "completed"  # the kid's k ended: lane-0's slot is free
    assert harness.unsettled(snap) == ["m2:b available, not claimed (its limit's slot free)"]


def test_a_settle_that_fails_names_a_worker_whose_threads_all_wait_at_gates() -> None:
    """A live worker whose step threads all wait at gates claims nothing: a settle that
    fails says so (a run it left not started is not a lost wake-up), and counts what
    each worker holds."""
    harness = Harness.__new__(Harness)  # no database: occupancy() reads the snapshot only
    harness.workers = [
        WorkerProc(SimpleNamespace(pid=100), state="killed"),  # type: ignore[arg-type]
        WorkerProc(SimpleNamespace(pid=200)),  # type: ignore[arg-type]
    ]
    held = {"state": "running", "pid": 200}
    snap = Snapshot(
        runs={},
        jobs={(f"m{i}", "a"): held for i in range(CONCURRENCY - 1)},
        waiting=[Exec(f"m{i}", "a", 1, 200, 1, 1) for i in range(CONCURRENCY - 1)],
        max_n={},
    )
    assert harness.occupancy(snap) == (
        f"100 killed: 0/{CONCURRENCY} threads at gates, 0 jobs held, "
        f"200 live: {CONCURRENCY - 1}/{CONCURRENCY} threads at gates, {CONCURRENCY - 1} jobs held"
    )
    snap.waiting.append(Exec("m0", "a", 0, 200, 1, 0))  # an older execution, its job rescued
    assert harness.occupancy(snap).endswith(
        f"200 live: {CONCURRENCY}/{CONCURRENCY} threads at gates (full: it claims nothing), "
        f"{CONCURRENCY - 1} jobs held"
    )


def test_only_rules_on_workers_have_preconditions() -> None:
    """Which rules hypothesis may choose depends only on what the rules decided: the
    workers started, frozen and stopped. Every condition on runs is checked as the rule
    runs (:func:`when`), since what a run became can depend on a race."""
    rules = [getattr(f, RULE_MARKER, None) for f in vars(ModelMachine).values()]
    with_preconditions = {r.function.__name__ for r in rules if r is not None and r.preconditions}
    assert with_preconditions == {
        "kill_worker",
        "retire_worker",
        "freeze_worker",
        "thaw_worker",
        "start_worker",
    }


@pytest.mark.processes
def test_a_signal_to_a_parked_wait_node_is_compared_once_delivered(harness: Harness) -> None:
    """Finish ``a`` (``w`` parks), signal the run: the checks wait until a worker has
    delivered the signal (the replay of a derandomized failure: they compared at once)."""
    ModelMachine.harness = harness
    machine = ModelMachine()
    try:
        machine.start(runs=[(False, False, False)])
        machine.settled_and_as_modelled()
        machine.finish(pick=0)
        machine.settled_and_as_modelled()
        machine.signal(pick=0, how="run", payload=1)
        machine.settled_and_as_modelled()
        assert machine.model_of("m1").summary()["b"] == "active"
    finally:
        machine.teardown()


@pytest.mark.processes
def test_a_fork_that_runs_its_wait_node_again_waits_for_a_signal_of_its_own(
    harness: Harness,
) -> None:
    """A completed run ``a -> w -> b`` forked with ``w`` to run again: the fork keeps
    ``a``, its ``w`` parks (the source's signal is the source's), and a signal to the
    fork's key lets ``b`` run; a fork with nothing to run again is completed at once."""
    ModelMachine.harness = harness
    machine = ModelMachine()
    try:
        machine.start(runs=[(True, False, True)])
        machine.settled_and_as_modelled()
        machine.finish(pick=0)  # a; w runs on the stored signal
        machine.settled_and_as_modelled()
        machine.finish(pick=0)  # b; c makes its kid, whose g makes the grandkid
        machine.settled_and_as_modelled()
        machine.release_step("m1/kid/kid", "q", "finish")  # the grandkid completes, then g
        machine.release_step("m1/kid", "k", "finish")  # the kid completes, then c
        machine.release_step("m1", "m0", "finish")
        machine.release_step("m1", "m1", "finish")  # m collects, then m1 completes
        assert machine.model_of("m1").state == "completed"
        machine.fork(pick=0, rerun="w", again=False)
        machine.settled_and_as_modelled()
        assert machine.model_of("m2").summary() == {
            "run": "running",
            "a": "completed",
            "w": "parked",
            "b": "blocked",
            "c": "blocked",
            "kid": "none",
            "g": "none",
            "k": "none",
            "grand": "none",
            "q": "none",
            "m": "blocked",
            "m0": "none",
            "m1": "none",
        }
        machine.signal(pick=0, how="key", payload=2)
        machine.settled_and_as_modelled()
        assert machine.model_of("m2").summary()["b"] == "active"
        machine.fork(pick=1, rerun=None, again=False)  # m1 again, keeping every step
        machine.settled_and_as_modelled()
        assert machine.model_of("m3").state == "completed"
        machine.fork(pick=1, rerun="b", again=True)  # m1 under m3's key: the same input
        machine.settled_and_as_modelled()
    finally:
        machine.teardown()


@pytest.mark.processes
def test_a_child_run_fails_its_parent_is_retried_with_it_and_is_never_made_twice(
    harness: Harness,
) -> None:
    """Through the machine: a child run whose step spends its attempts fails an attempt of
    ``c``, whose next attempt runs the same child again, and its last fails ``c`` and the
    run; ``retry()`` of the run retries the child (the same one, its step's attempts
    anew); ``retry_all()`` reads the completed child without a second one; a cancel of a
    run cascades to its running child and grandkid; a run past its deadline leaves its
    children running, is not purged while one of them runs (the grandkid too, below a
    completed kid), and purging it then purges them (the purge counting the parent
    alone)."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def summary(tag: str) -> dict[str, str]:
        return machine.model_of(tag).summary()

    def tree(tag: str) -> tuple[str, ...]:
        """The run, ``c``, the kid, its ``g`` and ``k``, the grandkid and its ``q``."""
        seen = summary(tag)
        return tuple(seen[part] for part in ("run", "c", "kid", "g", "k", "grand", "q"))

    try:
        machine.start(runs=[(True, False, True), (False, True, True), (False, False, True)])
        machine.settled_and_as_modelled()
        machine.bring_to_child(pick=1, then="exhaust", level="kid")  # m1
        machine.settled_and_as_modelled()
        # c's second attempt runs the failed child again, its step's attempts anew (its
        # g keeps the grandkid's result: completed, it is not run again).
        assert summary("m1") == {
            "run": "running",
            "a": "completed",
            "w": "completed",
            "b": "completed",
            "c": "parked",
            "kid": "running",
            "g": "completed",
            "k": "active",
            "grand": "completed",
            "q": "completed",
            "m": "parked",
            "m0": "active",
            "m1": "active",
        }
        (kid,) = machine.handles[1].children()
        machine.bring_to_child(pick=1, then="exhaust", level="kid")  # c's last attempt fails
        machine.settled_and_as_modelled()
        assert [c.id for c in machine.handles[1].children()] == [kid.id]  # never made twice
        assert summary("m1") == {
            "run": "failed",
            "a": "completed",
            "w": "completed",
            "b": "completed",
            "c": "failed",
            "kid": "failed",
            "g": "completed",
            "k": "failed",
            "grand": "completed",
            "q": "completed",
            "m": "cancelled",
            "m0": "active",
            "m1": "active",
        }
        machine.retry(pick=0, every_step=False)  # refused: m's items still run
        machine.settled_and_as_modelled()
        assert summary("m1")["run"] == "failed"
        machine.release_step("m1", "m0", "finish")
        machine.release_step("m1", "m1", "finish")
        machine.retry(pick=0, every_step=False)
        machine.settled_and_as_modelled()
        assert (summary("m1")["c"], summary("m1")["kid"]) == ("parked", "running")
        assert summary("m1")["m"] == "completed"  # its items completed: it collects at once
        kid_model = machine.model_of("m1").kid
        assert kid_model is not None
        assert kid_model.steps[KID_STEP].failures == 0
        machine.finish(pick=0)  # k
        machine.settled_and_as_modelled()
        assert summary("m1")["run"] == "completed"
        machine.retry(pick=0, every_step=True)
        machine.settled_and_as_modelled()
        machine.bring_to_child(pick=0, then=None, level="grand")  # c reads its child at once
        machine.settled_and_as_modelled()
        assert (summary("m1")["m0"], summary("m1")["m1"]) == ("active", "active")  # anew
        machine.release_step("m1", "m0", "finish")
        machine.release_step("m1", "m1", "finish")
        assert summary("m1")["run"] == "completed"
        (kid,) = machine.handles[1].children()
        assert kid.status().parent_id == machine.handles[1].id

        machine.bring_to_child(pick=3, then=None, level="grand")  # m2, with a deadline
        machine.settled_and_as_modelled()
        machine.a_day_passes(pick=0)
        machine.settled_and_as_modelled()
        assert tree("m2") == (
            "failed",
            "cancelled",
            "running",
            "parked",
            "blocked",
            "running",
            "active",
        )
        machine.purge(everything=True)  # m1 with its children; m2's still run
        machine.settled_and_as_modelled()
        assert machine.model_of("m1").purged
        assert not machine.model_of("m2").purged
        machine.release_step("m2/kid/kid", GRAND_STEP, "finish")  # g completes; k runs
        machine.release_step("m2/kid", KID_STEP, "finish")
        assert tree("m2")[2:] == ("completed", "completed", "completed", "completed", "completed")
        machine.retry_child(pick=0, level="grand", every_step=True)  # below a completed kid
        machine.settled_and_as_modelled()
        assert tree("m2")[2:] == ("completed", "completed", "completed", "running", "active")
        machine.purge(everything=True)  # m2 kept: its grandkid runs
        machine.settled_and_as_modelled()
        assert not machine.model_of("m2").purged
        machine.release_step("m2/kid/kid", GRAND_STEP, "finish")
        machine.purge(everything=True)  # m2, with its kid and grandkid
        machine.settled_and_as_modelled()
        assert machine.model_of("m2").purged

        machine.bring_to_child(pick=5, then=None, level="grand")  # m3
        machine.settled_and_as_modelled()
        machine.cancel(pick=0)  # cascades to the kid and the grandkid
        machine.settled_and_as_modelled()
        assert tree("m3") == (
            "cancelled",
            "cancelled",
            "cancelled",
            "cancelled",
            "cancelled",
            "cancelled",
            "active",
        )
        machine.release_step("m3", "m0", "finish")
        machine.release_step("m3", "m1", "finish")  # in the cancelled run
        # c retries the kid, whose g cannot retry the grandkid (its step runs): each of
        # g's attempts fails, so the kid, then c's second attempt too, and the run.
        machine.retry(pick=0, every_step=False)
        machine.settled_and_as_modelled()
        assert tree("m3") == (
            "failed",
            "failed",
            "failed",
            "failed",
            "cancelled",
            "cancelled",
            "active",
        )
    finally:
        machine.teardown()


@pytest.mark.processes
def test_a_grandkid_is_cancelled_retried_and_read_through_its_tree(harness: Harness) -> None:
    """Through the machine, two levels of children: a grandkid cancelled by its own
    handle while its step runs fails its node's attempts (a child whose step runs cannot
    be retried), so the kid and the run fail; once the step ended, ``retry()`` of the run
    retries the kid, whose ``g`` retries the grandkid (nothing left to run: completed at
    once) and reads it, no child made twice; ``retry_all()`` of the grandkid leaves its
    completed parents as they are; ``retry_all()`` of the kid parks ``g`` for the running
    grandkid; a cancel of the kid alone cascades to the grandkid, and a ``retry()`` of
    the kid then runs its ``g`` again, which retries the grandkid."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def tree() -> tuple[str, ...]:
        seen = machine.model_of("m1").summary()
        return tuple(seen[part] for part in ("run", "c", "kid", "g", "k", "grand", "q"))

    try:
        machine.start(runs=[(True, False, True)])
        machine.settled_and_as_modelled()
        machine.bring_to_child(pick=0, then=None, level="grand")
        machine.settled_and_as_modelled()
        assert tree() == ("running", "parked", "running", "parked", "blocked", "running", "active")
        (kid,) = machine.handles[1].children()
        (grand,) = kid.children()
        status = grand.status()
        assert (status.parent_id, status.parent_node) == (kid.id, KID_NODE)

        machine.cancel_child(pick=0, level="grand")
        machine.settled_and_as_modelled()
        assert tree() == (
            "failed",
            "failed",
            "failed",
            "failed",
            "cancelled",
            "cancelled",
            "active",
        )
        machine.release_step("m1/kid/kid", GRAND_STEP, "finish")  # in the cancelled grandkid
        machine.release_step("m1", "m0", "finish")
        machine.release_step("m1", "m1", "finish")
        machine.retry(pick=0, every_step=False)
        machine.settled_and_as_modelled()
        assert tree() == (
            "running",
            "parked",
            "running",
            "completed",
            "active",
            "completed",
            "completed",
        )
        assert [c.id for c in machine.handles[1].children()] == [kid.id]
        assert [c.id for c in kid.children()] == [grand.id]
        machine.release_step("m1/kid", KID_STEP, "finish")
        assert tree()[0] == "completed"

        machine.retry_child(pick=0, level="grand", every_step=True)
        machine.settled_and_as_modelled()
        assert tree() == (
            "completed",
            "completed",
            "completed",
            "completed",
            "completed",
            "running",
            "active",
        )
        machine.retry_child(pick=0, level="kid", every_step=True)
        machine.settled_and_as_modelled()
        assert tree() == (
            "completed",
            "completed",
            "running",
            "parked",
            "blocked",
            "running",
            "active",
        )
        machine.cancel_child(pick=0, level="kid")
        machine.settled_and_as_modelled()
        assert tree() == (
            "completed",
            "completed",
            "cancelled",
            "cancelled",
            "cancelled",
            "cancelled",
            "active",
        )
        machine.retry_child(pick=0, level="kid", every_step=False)  # refused: q still runs
        machine.settled_and_as_modelled()
        assert tree() == (
            "completed",
            "completed",
            "cancelled",
            "cancelled",
            "cancelled",
            "cancelled",
            "active",
        )
        machine.release_step("m1/kid/kid", GRAND_STEP, "fail")  # an attempt left: cancelled
        machine.retry_child(pick=0, level="kid", every_step=False)  # g retries the grandkid
        machine.settled_and_as_modelled()
        assert tree() == (
            "completed",
            "completed",
            "running",
            "parked",
            "blocked",
            "running",
            "active",
        )
        machine.release_step("m1/kid/kid", GRAND_STEP, "finish")
        machine.release_step("m1/kid", KID_STEP, "finish")
        assert tree()[2:] == ("completed",) * 5
        machine.purge(everything=True)
        machine.settled_and_as_modelled()
        assert machine.model_of("m1").purged
    finally:
        machine.teardown()


@pytest.mark.processes
def test_a_failed_map_item_fails_its_run_and_retry_runs_it_alone_and_retry_all_every_item(
    harness: Harness,
) -> None:
    """Through the machine: an item of ``m`` that spends its attempts fails ``m`` and the
    run, naming the item; ``retry()`` runs that item alone again (its attempts anew, the
    completed item kept: not executed again), and ``m`` collects both; ``retry_all()``
    forgets the items, and ``m`` expands anew once ``b`` completes again."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def summary() -> dict[str, str]:
        return machine.model_of("m1").summary()

    def executions(step: str) -> int:
        with harness.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM model_exec WHERE tag = 'm1' AND step = :s"),
                    {"s": step},
                ).scalar_one()
            )

    def items_done() -> tuple[int | None, int | None]:
        detail = cyclone.Client(harness.engine).get_run_detail(machine.handles[1].id)
        assert detail is not None
        (node,) = [s for s in detail.steps if s.name == "m"]
        return node.items_done, node.items_total

    try:
        machine.start(runs=[(True, False, True)])
        machine.settled_and_as_modelled()
        machine.release_step("m1", "a", "finish")  # w runs on the stored signal
        machine.release_step("m1", "b", "finish")  # c makes its kid; m expands
        assert (summary()["m"], summary()["m0"], summary()["m1"]) == ("parked", "active", "active")
        machine.release_step("m1/kid/kid", GRAND_STEP, "finish")  # g completes
        machine.release_step("m1/kid", KID_STEP, "finish")  # c completes
        machine.release_step("m1", "m0", "finish")
        machine.release_step("m1", "m1", "fail")
        machine.release_step("m1", "m1", "fail")  # its last attempt
        assert summary() == {
            "run": "failed",
            "a": "completed",
            "w": "completed",
            "b": "completed",
            "c": "completed",
            "kid": "completed",
            "g": "completed",
            "k": "completed",
            "grand": "completed",
            "q": "completed",
            "m": "failed" if KNOWN_DEFECTS_FIXED["map_item_fails_node"] else "cancelled",
            "m0": "completed",
            "m1": "failed",
        }
        error = machine.handles[1].status().error
        assert error is not None
        assert (error["step"], error["item"]) == ("m", 1)

        machine.retry(pick=0, every_step=False)
        machine.settled_and_as_modelled()
        assert (summary()["m"], summary()["m0"], summary()["m1"]) == (
            "parked",
            "completed",
            "active",
        )
        machine.release_step("m1", "m1", "finish")
        assert summary()["run"] == "completed"
        assert (executions("m0"), executions("m1")) == (1, 3)  # m0 kept, not run again
        assert items_done() == (2, 2)

        machine.retry(pick=0, every_step=True)
        machine.settled_and_as_modelled()
        assert (summary()["m"], summary()["m0"], summary()["m1"]) == ("blocked", "none", "none")
        machine.release_step("m1", "a", "finish")
        machine.release_step("m1", "b", "finish")  # c reads its completed kid; m expands
        assert (summary()["m"], summary()["m0"], summary()["m1"]) == ("parked", "active", "active")
        machine.release_step("m1", "m0", "finish")
        machine.release_step("m1", "m1", "finish")
        assert summary()["run"] == "completed"
        assert (executions("m0"), executions("m1")) == (2, 4)
        assert items_done() == (2, 2)
    finally:
        machine.teardown()


@pytest.mark.processes
def test_the_runs_of_a_lane_take_its_one_slot_in_turn(harness: Harness) -> None:
    """Through the machine, ``b`` under its lane's ``Concurrency(1)``: of ``m1``, ``m2`` and
    ``m3`` (one lane) driven to ``b``, one ``b`` runs and the others wait ``queued``
    (available, not claimed: the settle accepts it only while the slot is held), while
    ``m4``'s (another lane) runs. A cancel of a queued run cancels its ``b``; of the
    holder, leaves its ``b`` running, holding the slot, until it ends: then a waiting
    ``b`` takes it. A ``b`` failing with an attempt left queues behind one waiting; a
    retried run's ``b`` waits as a new one; the holder's worker killed, its ``b`` is
    rescued and the slot goes to one of the two; and at rest no ``b`` waits."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def lanes() -> tuple[str, ...]:
        return tuple(machine.model_of(f"m{n}").summary()["b"] for n in (1, 2, 3, 4))

    try:
        machine.start(runs=[(False, False, True)] * 4)
        machine.settled_and_as_modelled()
        for tag in ("m1", "m2", "m4", "m3"):
            machine.release_step(tag, "a", "finish")  # w runs on its stored signal
        assert lanes() == ("active", "queued", "queued", "active")
        machine.cancel(pick=3)  # m2, queued: its b is cancelled
        machine.settled_and_as_modelled()
        assert lanes() == ("active", "cancelled", "queued", "active")
        machine.cancel(pick=1)  # m1, holding the slot: its b runs on, and holds it
        machine.settled_and_as_modelled()
        assert lanes() == ("active", "cancelled", "queued", "active")
        machine.release_step("m1", "b", "finish")  # in the cancelled run: the slot frees
        assert lanes() == ("completed", "cancelled", "active", "active")
        machine.retry(pick=3, every_step=False)  # m2's b waits again, behind m3's
        machine.settled_and_as_modelled()
        assert lanes() == ("completed", "queued", "active", "active")
        machine.release_step("m3", "b", "fail")  # an attempt left: m2's b takes the slot
        assert lanes() == ("completed", "active", "queued", "active")
        assert machine.snap is not None
        e = machine.snap.current("m2", "b")
        assert e is not None
        machine.kill_worker(pick=[w.pid for w in harness.live()].index(e.pid))
        machine.settled_and_as_modelled()  # rescued: either b takes the slot
        assert sorted(lanes()[1:3]) == ["active", "queued"]
        machine.start_worker()
        machine.settled_and_as_modelled()
        for _ in range(2):  # the holder finishes; the other takes the slot, and finishes
            snap = machine.snap
            assert snap is not None
            holder = next(t for t in ("m2", "m3") if snap.current(t, "b") is not None)
            machine.release_step(holder, "b", "finish")
        assert lanes() == ("completed", "completed", "completed", "active")
    finally:
        machine.teardown()


@pytest.mark.processes
def test_a_kids_step_and_a_runs_step_share_their_lanes_slot(harness: Harness) -> None:
    """Through the machine: ``m1``'s kid's ``k`` (of the kid's workflow) holds the lane's
    slot, so ``m2``'s ``b`` (of the run's workflow, the same limit by name) waits for it.
    A cancel of ``m1`` cascades to its kid, whose ``k`` runs on and holds the slot until
    it ends; then ``m2``'s ``b`` takes it. A retry of ``m1`` (its ``c`` retries the kid)
    queues the kid's ``k`` behind ``m2``'s ``b``."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def lane() -> tuple[str, str]:
        return machine.model_of("m1").summary()["k"], machine.model_of("m2").summary()["b"]

    try:
        machine.start(runs=[(False, False, True)] * 2)
        machine.settled_and_as_modelled()
        machine.bring_to_child(pick=1, then=None, level="kid")  # m1: q finished, k runs
        machine.settled_and_as_modelled()
        assert lane() == ("active", "blocked")
        machine.release_step("m2", "a", "finish")
        assert lane() == ("active", "queued")
        machine.cancel(pick=1)  # m1, and its kid: k runs on, holding the slot
        machine.settled_and_as_modelled()
        assert machine.model_of("m1").summary()["kid"] == "cancelled"
        assert lane() == ("active", "queued")
        machine.release_step("m1/kid", "k", "fail")  # an attempt left, its run cancelled
        assert lane() == ("cancelled", "active")
        machine.release_step("m1", "m0", "finish")
        machine.release_step("m1", "m1", "finish")
        machine.retry(pick=1, every_step=False)  # c retries the kid: k waits for b
        machine.settled_and_as_modelled()
        assert lane() == ("queued", "active")
        machine.release_step("m2", "b", "finish")
        assert lane()[0] == "active"
    finally:
        machine.teardown()


@pytest.mark.processes
def test_a_step_rescued_from_a_worker_the_test_did_not_stop_may_lose_its_lanes_slot(
    harness: Harness,
) -> None:
    """A worker whose heartbeat lapses past ``rescue_after`` on a loaded machine (SIGSTOP
    here, behind the model's back) has its ``b`` rescued: available again, it may lose
    its lane's slot to the ``b`` queued behind it. The model, told only by the job's
    ``lost`` count, accepts both ends (the replay of what a loaded machine may do)."""
    ModelMachine.harness = harness
    machine = ModelMachine()
    try:
        machine.start(runs=[(False, False, True)] * 2)
        machine.settled_and_as_modelled()
        machine.release_step("m1", "a", "finish")
        machine.release_step("m2", "a", "finish")
        assert machine.snap is not None
        e = machine.snap.current("m1", "b")
        assert e is not None
        holder = next(w for w in harness.live() if w.pid == e.pid)
        assert harness.freeze(holder)

        def rescued() -> bool:
            return bool(harness.snapshot().jobs["m1", "b"]["lost"] == 1)

        wait_until(rescued, 30, 0.05, "the frozen worker's b was not rescued")
        harness.thaw(holder)
        machine.settled_and_as_modelled()
        summaries = (machine.model_of("m1").summary()["b"], machine.model_of("m2").summary()["b"])
        assert summaries in (("active", "queued"), ("queued", "active")), summaries
        if summaries[0] == "queued":  # only the rescue the database shows explains it
            assert machine.model_of("m1").steps["b"].lost == 1
    finally:
        machine.teardown()


def test_jobs_of_a_run_lost_together_are_rescued_in_one_statement() -> None:
    """Both items of ``m`` held by a worker that dies, each lost for the third time: the
    rescue fails both in one statement (each read its run running), where rescues one at
    a time fail the first and cancel the other (its run over). One lost for the third
    time and the other for the first: the first's failure cancels the other, made
    available by the same statement, unless a rescue of its own let a worker claim it
    first (the replay of a random-mode failure: the model lost them one by one)."""
    model = RunModel(number=1, key=None, v=0, deadline=False, signal=1)
    for step in ("a", "b"):
        model.advance()
        model.release(step, "finish")
    model.advance()
    assert model.items is not None
    for item in ITEMS:
        model.items[item].lost = 2
    ends = {
        (e.items["m0"].state, e.items["m1"].state)
        for e in lost_with_worker(model, [*ITEMS])
        if e.items
    }
    assert ends == {("failed", "failed"), ("failed", "cancelled"), ("cancelled", "failed")}
    model.items["m1"].lost = 0
    ends = {
        (e.items["m0"].state, e.items["m1"].state)
        for e in lost_with_worker(model, [*ITEMS])
        if e.items
    }
    assert ends == {("failed", "cancelled"), ("failed", "active")}


def lane_snapshot(paused: bool) -> tuple[Harness, Snapshot, dict[str, Any]]:
    """A harness with no database and a snapshot (as :meth:`Harness.snapshot` reads one)
    of ``m2``'s ``b`` available in the side queue (``paused`` or not), lane-0's slot free,
    and ``m4``'s ``b`` holding lane-1's; and ``m2``'s ``b``."""
    harness = Harness.__new__(Harness)  # no database: unsettled() reads the snapshot only
    harness.workers = [WorkerProc(SimpleNamespace(pid=100))]  # type: ignore[arg-type]
    done = {"state": "completed", "pending": 0, "due": False, "later": False}
    lane0, lane1 = ("model.lane", "lane-0"), ("model.lane", "lane-1")
    common = {"pending": 0, "due": True, "later": False, "max": 1, "queue": SIDE_QUEUE}
    waiting: dict[str, Any] = {"state": "available", "pid": None, "attempt": 0, "lease": 0}
    waiting["id"] = 8
    waiting |= {**common, "limit": lane0, "paused": paused}
    holder: dict[str, Any] = {"state": "running", "pid": 100, "attempt": 1, "lease": 3}
    holder |= {**common, "id": 10, "limit": lane1, "paused": paused}
    running = {"state": "running", "unstarted": False, "past_deadline": False, "signalled": True}
    snap = Snapshot(
        runs={"m2": dict(running), "m4": dict(running)},
        jobs={
            ("m2", "a"): done,
            ("m2", "w"): done,
            ("m2", "b"): waiting,
            ("m4", "b"): holder,
        },
        waiting=[Exec("m4", "b", 1, pid=100, attempt=1, lease=3, job_id=10)],
        max_n={},
    )
    return harness, snap, waiting


def test_a_step_of_a_paused_queue_is_settled_unclaimed_though_its_lanes_slot_is_free() -> None:
    """A ``b`` available in the side queue, its lane's slot free: while the queue is
    paused it waits for the resume (``queued``, settled); once resumed, a lost wake-up, and
    the settle says the slot is free."""
    harness, snap, _b = lane_snapshot(paused=True)
    assert harness.unsettled(snap) == []
    seen = snap.observed("m2")
    assert seen is not None
    assert seen["b"] == "queued"
    harness, snap, _b = lane_snapshot(paused=False)
    assert harness.unsettled(snap) == ["m2:b available, not claimed (its limit's slot free)"]


def test_a_job_of_a_paused_queue_claimed_since_the_pause_fails_the_checks() -> None:
    """A job of the paused side queue that ran when the pause took effect runs on; one
    running under another claim (another job, or the same claimed again: a new lease)
    was claimed while the queue was paused."""
    _harness, snap, b = lane_snapshot(paused=True)
    assert snap.claimed_while_paused({(10, 3)}) == []  # m4's b ran at the pause
    assert snap.claimed_while_paused(set()) == ["m4:b claimed while its queue model.side is paused"]
    b |= {"state": "running", "pid": 100, "attempt": 1, "lease": 1}
    assert snap.claimed_while_paused({(10, 3)}) == [
        "m2:b claimed while its queue model.side is paused"
    ]
    snap.jobs["m4", "b"]["lease"] = 4  # rescued, and claimed again
    assert len(snap.claimed_while_paused({(10, 3), (8, 1)})) == 1
    _harness, snap, b = lane_snapshot(paused=False)
    b |= {"state": "running", "pid": 100, "attempt": 1, "lease": 1}
    assert snap.claimed_while_paused(set()) == []  # resumed: claims are its business


def test_a_lane_runs_over_its_lowered_max_only_by_the_jobs_it_ran_when_lowered() -> None:
    """Two ``b`` of lane-0 running, its limit lowered to 1: both run on (over ``max``), but
    once one ends, a third claimed is over it; lowered to 0, one left running is not."""
    _harness, snap, b = lane_snapshot(paused=False)
    b |= {"state": "running", "pid": 100, "attempt": 1, "lease": 1}
    third = {**b, "lease": 1, "id": 12}
    snap.jobs["m3", "b"] = {**b, "lease": 2, "id": 11}
    snap.runs["m3"] = snap.runs["m2"]
    assert snap.over_limit(set()) == [
        "lane-0 runs 2 jobs (m2:b, m3:b), over its max 1 (0 of them claimed before it was set)"
    ]
    assert snap.over_limit({(8, 1), (11, 2)}) == []  # both ran when it was lowered
    snap.jobs["m2", "b"]["state"] = "completed"
    snap.jobs["m1", "b"] = third  # claimed since, over the lowered max
    snap.runs["m1"] = snap.runs["m2"]
    assert snap.over_limit({(8, 1), (11, 2)}) == [
        "lane-0 runs 2 jobs (m1:b, m3:b), over its max 1 (1 of them claimed before it was set)"
    ]
    third["state"] = "available"
    for job in snap.jobs.values():
        if job.get("max"):
            job["max"] = 0
    assert snap.over_limit({(11, 2), (10, 3)}) == []  # (m4's b of lane-1 too)
    assert snap.over_limit({(10, 3)}) == [
        "lane-0 runs 1 jobs (m3:b), over its max 0 (0 of them claimed before it was set)"
    ]


def test_a_pause_or_a_limit_set_waits_for_the_workers_transactions_begun_before_it(
    harness: Harness,
) -> None:
    """A pause or a limit set takes effect for the claims that begin after it: the test
    waits (:meth:`Harness.barrier`) for the workers' transactions under way then, which
    may have read the state before it; not for one begun since, nor one at a gate."""
    url = harness.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, application_name="model-1") as older:
        older.execute("SELECT 1")  # a transaction open, begun before the change
        moment = harness.now()
        assert harness.begun_before(moment) == ["model-1 idle in transaction: SELECT 1"]
        older.commit()
        assert harness.begun_before(moment) == []
        older.execute("SELECT 2")  # begun after it
        assert harness.begun_before(moment) == []
        older.rollback()
    harness.barrier()


@pytest.mark.processes
def test_a_paused_lanes_queue_holds_its_steps_and_a_limit_set_at_runtime_moves_its_slots(
    harness: Harness,
) -> None:
    """Through the machine: the side queue paused, ``m1``'s and ``m2``'s ``b`` wait
    ``queued`` with lane-0's slot free; resumed, the one runnable first (``m1``'s: the
    oldest due) takes it. The limit raised to 2, ``m2``'s ``b`` takes the second slot;
    lowered to 1, both run on, and once ``m1``'s ends, ``m3``'s waits for ``m2``'s; set to
    0, it waits with no job of its lane running; set to 1 again, it runs."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def lanes() -> tuple[str, ...]:
        return tuple(machine.model_of(f"m{n}").summary()["b"] for n in (1, 2, 3))

    def lane_0() -> tuple[int, int]:
        limits = cyclone.Client(harness.engine).list_limits()
        (limit,) = [li for li in limits if li.name == LANE_NAME]
        return limit.keys["lane-0"]

    try:
        machine.start(runs=[(False, False, True)] * 3)
        machine.settled_and_as_modelled()
        machine.pause_side_queue(pause=True)
        machine.pause_side_queue(pause=True)  # paused already: it says so
        machine.settled_and_as_modelled()
        machine.release_step("m1", "a", "finish")  # w runs on its stored signal
        machine.release_step("m2", "a", "finish")
        assert lanes() == ("queued", "queued", "blocked")
        assert lane_0() == (0, 2)
        machine.pause_side_queue(pause=False)
        machine.settled_and_as_modelled()
        assert lanes() == ("active", "queued", "blocked")
        machine.set_lane_limit(top=2)
        machine.settled_and_as_modelled()
        assert lanes() == ("active", "active", "blocked")
        machine.set_lane_limit(top=1)
        machine.settled_and_as_modelled()
        assert lane_0() == (2, 0)  # over the lowered max: they run on
        machine.release_step("m3", "a", "finish")
        machine.release_step("m1", "b", "finish")
        assert lanes() == ("completed", "active", "queued")
        machine.set_lane_limit(top=0)
        machine.settled_and_as_modelled()
        machine.release_step("m2", "b", "finish")
        assert lanes() == ("completed", "completed", "queued")
        assert lane_0() == (0, 1)
        machine.set_lane_limit(top=1)
        machine.settled_and_as_modelled()
        assert lanes() == ("completed", "completed", "active")
    finally:
        machine.teardown()


def test_a_freed_slot_taken_ahead_of_a_step_of_its_lane_due_before_fails_the_checks() -> None:
    """A lane's freed slot goes to its oldest due step: ``m2``'s ``b``, waiting at the last
    check, still waiting while ``m3``'s (due after it) took the slot since, was passed
    over; not if ``m3``'s was due first, nor if ``m2``'s moved since (claimed, handed back:
    a new lease), nor if its queue is paused, nor for a step that ran at the last check."""
    _harness, before, b = lane_snapshot(paused=False)
    b["rank"] = (0, 5, 8)
    holder = {**b, "state": "running", "pid": 100, "attempt": 1, "lease": 1, "id": 9}
    holder["rank"] = (0, 1, 9)
    third = {**b, "id": 11, "rank": (0, 7, 11)}
    before.runs["m3"] = dict(before.runs["m2"])
    before.jobs |= {("m3", "b"): third, ("m1", "b"): holder}
    for job in before.jobs.values():
        job.setdefault("rank", (0, 0, job.get("id", 0)))
    now = copy.deepcopy(before)
    now.jobs["m1", "b"]["state"] = "completed"
    now.jobs["m3", "b"] |= {"state": "running", "pid": 100, "attempt": 1, "lease": 1}
    assert now.overtaken(before) == ["m3:b took a slot of lane-0 ahead of m2:b, due before it"]
    assert now.overtaken(now) == []  # it ran at the last check
    now.jobs["m3", "b"]["rank"] = (0, 4, 11)  # due before m2's
    assert now.overtaken(before) == []
    now.jobs["m3", "b"]["rank"] = (0, 7, 11)
    now.jobs["m2", "b"] |= {"lease": 1}  # claimed and handed back since
    assert now.overtaken(before) == []
    now.jobs["m2", "b"] |= {"lease": 0, "paused": True}
    assert now.overtaken(before) == []


@pytest.mark.processes
def test_a_grandkids_step_in_the_paused_side_queue_waits_unclaimed_until_it_resumes(
    harness: Harness,
) -> None:
    """Through the machine, ``q`` (no limit: the ordinary claim) in the paused side queue:
    the grandkid made, its ``q`` waits ``queued``; a cancel of the grandkid (which ``g``
    retries) or of the run cancels it unclaimed, a retry of the grandkid makes it wait
    again; resumed, it runs.
    Paused again, ``q`` failing with an attempt left waits, available, for the resume,
    then runs again."""
    ModelMachine.harness = harness
    machine = ModelMachine()

    def grand() -> tuple[str, str]:
        seen = machine.model_of("m1").summary()
        return seen["grand"], seen["q"]

    def executions() -> int:
        with harness.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT count(*) FROM model_exec WHERE step = 'q'")
                ).scalar_one()
            )

    try:
        machine.start(runs=[(False, False, True)])
        machine.settled_and_as_modelled()
        machine.pause_side_queue(pause=True)
        machine.settled_and_as_modelled()
        machine.bring_to_child(pick=0, then=None, level="grand")  # b waits: nothing moves
        machine.settled_and_as_modelled()
        assert machine.model_of("m1").summary()["b"] == "queued"
        machine.pause_side_queue(pause=False)
        machine.settled_and_as_modelled()
        machine.pause_side_queue(pause=True)
        machine.bring_to_child(pick=0, then=None, level="grand")  # b finishes; the kid made
        machine.settled_and_as_modelled()
        assert grand() == ("running", "queued")
        machine.cancel_child(pick=0, level="grand")  # g's second attempt retries it
        machine.settled_and_as_modelled()
        assert grand() == ("running", "queued")
        machine.cancel(pick=0)  # the run, cascading to the kid and the grandkid
        machine.settled_and_as_modelled()
        assert grand() == ("cancelled", "cancelled")
        machine.retry_child(pick=0, level="grand", every_step=False)
        machine.settled_and_as_modelled()
        assert grand() == ("running", "queued")
        assert executions() == 0
        machine.pause_side_queue(pause=False)
        machine.settled_and_as_modelled()
        assert grand() == ("running", "active")
        machine.pause_side_queue(pause=True)
        machine.settled_and_as_modelled()
        machine.release_step("m1/kid/kid", GRAND_STEP, "fail")  # an attempt left
        assert grand() == ("running", "queued")
        machine.pause_side_queue(pause=False)
        machine.settled_and_as_modelled()
        machine.release_step("m1/kid/kid", GRAND_STEP, "finish")
        assert grand() == ("completed", "completed")
        assert executions() == 2
    finally:
        machine.teardown()


def test_a_run_whose_side_steps_wait_is_promoted_one_step_or_both() -> None:
    """A run's ``b`` and its grandkid's ``q`` both waiting (``queued``: the side queue was
    paused), the queue resumed: either may be claimed, or both (``b``'s lane's slot may be
    held by another run); none while the queue is paused."""
    model = RunModel(number=1, key=None, v=0, deadline=False, signal=1)
    model.steps["a"].state = model.steps["w"].state = "completed"
    model.steps["b"].state = "queued"
    model.kid = run_model.ChildModel.kid()
    model.kid.child = run_model.ChildModel.grand()
    model.kid.child.steps[GRAND_STEP].state = "queued"
    ends = {(m.summary()["b"], m.summary()["q"]) for m in model.promotions()}
    assert ends == {("active", "queued"), ("queued", "active"), ("active", "active")}
    run_model.SIDE_PAUSED["on"] = True
    try:
        assert model.promotions() == []
    finally:
        run_model.SIDE_PAUSED["on"] = False


def test_a_limited_workflows_held_runs_are_admitted_oldest_first_as_slots_free(
    harness: Harness,
) -> None:
    """The limited workflow's runs, through the machine's rules (checked after each): a
    key's second and third runs held behind its first; the first completes, the second is
    admitted (not the third, cancelled held); a run past its deadline fails, its step
    running on; a run never started retried is held again, behind those held since; a
    started run retried is refused while its key is full (or its step still runs), and
    restarts in progress once it has room; the limit raised admits the next held run,
    lowered stops none of those in progress."""
    ModelMachine.harness = harness
    RULES_RUN.clear()
    machine = ModelMachine()
    steps: list[tuple[str, dict[str, Any]]] = [
        (
            "start",
            {"runs": [(False, False, False)], "limited": [(0, False), (0, True), (0, False)]},
        ),
        ("release_limited", {"pick": 0, "verdict": "finish"}),  # s1: s2 admitted
        ("cancel_limited", {"pick": 1}),  # s3, held: never starts
        ("a_day_passes_limited", {"pick": 0}),  # s2 past its deadline: fails
        ("submit_limited", {"key": 0, "deadline": False}),  # s4: admitted at once
        ("submit_limited", {"key": 0, "deadline": False}),  # s5: held
        ("retry_limited", {"pick": 2, "every_step": False}),  # s3: held again, behind s5
        ("retry_limited", {"pick": 1, "every_step": True}),  # s2: past its deadline
        ("release_limited", {"pick": 1, "verdict": "fail"}),  # s4, an attempt left
        ("release_limited", {"pick": 1, "verdict": "fail"}),  # s4 fails: s5 admitted
        ("retry_limited", {"pick": 2, "every_step": False}),  # s4: s5 in progress, refused
        ("set_slot_limit", {"top": 2}),  # s3 admitted
        ("set_slot_limit", {"top": 1}),  # both run on
        ("cancel_limited", {"pick": 1}),  # s5: its h runs on at its gate
        ("retry_limited", {"pick": 3, "every_step": False}),  # s5: its h still runs
        ("retry_limited", {"pick": 2, "every_step": False}),  # s4: s3 in progress, refused
        ("release_limited", {"pick": 0, "verdict": "finish"}),  # s2's h: its run failed
        ("release_limited", {"pick": 0, "verdict": "finish"}),  # s3 completes
        ("retry_limited", {"pick": 3, "every_step": False}),  # s4: in progress again
    ]
    try:
        for name, arguments in steps:
            getattr(machine, name)(**arguments)
            machine.settled_and_as_modelled()
    finally:
        machine.teardown()
    assert {r.tag: r.state for r in machine.slot.runs.values()} == {
        "s1": "completed",
        "s2": "failed",
        "s3": "completed",
        "s4": "completed",
        "s5": "cancelled",
    }
    seen = {k: v for k, v in RULES_RUN.items() if k.startswith("retry_limited: ")}
    assert seen == {
        "retry_limited: cancelled never started done": 1,
        "retry_limited: failed refused": 3,
        "retry_limited: cancelled refused": 1,
        "retry_limited: failed done": 1,
    }, seen
