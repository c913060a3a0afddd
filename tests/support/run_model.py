"""The reference model of the model-based test (``tests/test_model.py``): pure Python.

One :class:`RunModel` per run of :data:`tests.support.model_proc.WORKFLOW` (``a -> w ->
b -> {c, m}``, ``c`` a child node, ``m`` a map node with two items ``m0`` and ``m1``) and its
child run (the *kid*, one step ``k``) says, from the
operations applied to it, what state the run and each of its steps must be in once the
workers have done what they can (the test *settles* the database before comparing).
Each operation returns what the call must return or raise. Where
the real system races (a cancel sent while a released step is being recorded, a
deadline and a wait's timeout falling due together), an operation returns several
alternative models and the test keeps the one the database shows; none matching is a
failure.

Step states: ``blocked`` (upstream not completed), ``active`` (claimed and waiting at
its gate, or available), ``parked`` (``w`` waiting for its signal, ``c`` for its kid to
end, ``m`` for its items), and the terminal ``completed``, ``failed``, ``cancelled``. The
kid is ``none`` until ``c`` first parks; then a run state of its own, with ``k``'s state.
The items are ``none`` until ``m`` first expands (and again after a ``retry_all``); each
then has a step's states and attempts of its own.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

STEPS = ("a", "w", "b", "c", "m")
DOWNSTREAM = {
    "a": {"a", "w", "b", "c", "m"},
    "w": {"w", "b", "c", "m"},
    "b": {"b", "c", "m"},
    "c": {"c"},
    "m": {"m"},
}
"""Each step and the steps downstream of it (what a fork naming it runs again)."""
ITEMS = ("m0", "m1")
"""``m``'s items, by the node's name and the item's index."""
ATTEMPTS = {"a": 2, "w": 1, "b": 2, "c": 2, "k": 2, "m0": 2, "m1": 2}
KID_STEP = "k"
ITEM_FAILS_NODE = {"on": True}
"""Whether an item failed for good fails its map node (docs/map.md), or (the defect the
model-based test's ``map_item_fails_node`` flag stands for) leaves it cancelled with the
run's other steps not started; the test sets it from that flag."""
LOSSES = 3
"""A job lost with its worker this many times fails (max(max_attempts, 3))."""
TERMINAL = ("completed", "failed", "cancelled")


class Expect:
    """What a call must raise, by name (the test maps names to cyclone's errors)."""

    NOT_FOUND = "NotFoundError"
    INVALID_STATE = "InvalidStateError"
    CONFLICT = "SubmitConflictError"


@dataclass
class StepModel:
    state: str = "blocked"
    failures: int = 0
    lost: int = 0


@dataclass
class RunModel:
    number: int
    key: str | None
    v: int
    deadline: bool
    state: str = "running"
    steps: dict[str, StepModel] = field(default_factory=lambda: {s: StepModel() for s in STEPS})
    signal: int | None = None
    timer: bool = False
    """Whether ``w``'s timeout has passed while it waits (a day passed since it parked)."""
    deadline_passed: bool = False
    retention0: bool = False
    purged: bool = False
    input_tag: str = ""
    """The tag in the run's input: its own, or for a fork that of the run it came from."""
    kid: str | None = None
    """The state of the child run ``c`` made (None: not made yet)."""
    k: StepModel = field(default_factory=StepModel)
    """The kid's step."""
    items: dict[str, StepModel] | None = None
    """``m``'s items (None: not expanded)."""

    def __post_init__(self) -> None:
        self.input_tag = self.input_tag or self.tag

    @property
    def tag(self) -> str:
        return f"m{self.number}"

    def copy(self) -> RunModel:
        return copy.deepcopy(self)

    def summary(self) -> dict[str, str]:
        return {
            "run": self.state,
            **{s: self.steps[s].state for s in STEPS},
            "kid": self.kid or "none",
            "k": self.k.state if self.kid else "none",
            **{i: self.items[i].state if self.items else "none" for i in ITEMS},
        }

    def step(self, step: str) -> StepModel:
        if step in ITEMS:
            assert self.items is not None, (self.tag, step)
            return self.items[step]
        return self.k if step == KID_STEP else self.steps[step]

    def items_active(self) -> bool:
        return self.items is not None and any(i.state == "active" for i in self.items.values())

    def state_of(self, step: str) -> str | None:
        """The state of the run ``step`` belongs to (the kid's for ``k``)."""
        return self.kid if step == KID_STEP else self.state

    # -- progress that workers make on their own ---------------------------------------

    def advance_one(self, map_first: bool = False) -> bool:
        """One step of progress the workers make without the test; False when none is left.

        ``map_first``: the map node and its items move before ``c`` (which of the two a
        worker reaches first is a race when both become runnable at once, after a retry).
        """
        if self.purged:
            return False
        if self.kid == "running" and self.k.state == "blocked":
            self.k.state = "active"  # whatever its parent's state: the kid runs on its own
            return True
        if self.state != "running":
            return False
        a, w, b, c = (self.steps[s] for s in STEPS[:4])
        if a.state == "blocked":
            a.state = "active"
            return True
        if w.state == "blocked" and a.state == "completed":
            w.state = "completed" if self.signal is not None else "parked"
            self.timer = False
            return True
        if w.state == "parked" and self.signal is not None:
            w.state = "completed"
            return True
        if w.state == "parked" and self.timer:
            self.timer = False
            self._fail("w")
            return True
        if b.state == "blocked" and w.state == "completed":
            b.state = "active"
            return True
        if map_first and self._advance_map():
            return True
        if c.state == "blocked" and b.state == "completed":
            self._start_kid()
            return True
        if c.state == "parked" and self.kid == "completed":
            c.state = "completed"
            return True
        if c.state == "parked" and self.kid in ("failed", "cancelled"):
            c.failures += 1  # the kid's end fails this attempt of c
            if c.failures >= ATTEMPTS["c"]:
                self._fail("c")
            else:
                self._start_kid()  # the next attempt (no backoff) runs the kid again
            return True
        if self._advance_map():
            return True
        if all(self.steps[s].state == "completed" for s in STEPS):
            self.state = "completed"
            return True
        return False

    def _advance_map(self) -> bool:
        b, m = self.steps["b"], self.steps["m"]
        if m.state == "blocked" and b.state == "completed":
            if self.items is None:  # expands: one job per item, claimed at once
                self.items = {i: StepModel(state="active") for i in ITEMS}
            done = all(i.state == "completed" for i in self.items.values())
            m.state = "completed" if done else "parked"
            return True
        if self.items is not None and any(i.state == "blocked" for i in self.items.values()):
            for i in self.items.values():
                if i.state == "blocked":  # reset by a retry: available again, claimed
                    i.state = "active"
            return True
        if (
            m.state == "parked"
            and self.items is not None
            and all(i.state == "completed" for i in self.items.values())
        ):
            m.state = "completed"  # the last item made it runnable: it collects
            return True
        return False

    def advance(self, map_first: bool = False) -> RunModel:
        while self.advance_one(map_first):
            pass
        return self

    def _start_kid(self) -> None:
        """``c`` is claimed: it makes its kid and parks, or (a later attempt) reads the
        kid it made: completed, its output; running, it parks; failed or cancelled, it
        retries the kid (its failed and cancelled step, attempts reset) and parks, unless
        the kid's step still runs (cancelled while at its gate): then ``c`` fails."""
        c = self.steps["c"]
        if self.kid is None:
            self.kid, self.k = "running", StepModel()
        elif self.kid == "completed":
            c.state = "completed"
            return
        elif self.kid in ("failed", "cancelled"):
            if self.k.state == "active":
                self._fail("c")
                return
            if self.k.state in ("failed", "cancelled"):
                self.k = StepModel()
            self.kid = "completed" if self.k.state == "completed" else "running"
        c.state = "parked"

    def _end_kid(self) -> None:
        """The kid's step ended for good: the kid ends with it (one transaction)."""
        if self.kid == "running":
            self.kid = "completed" if self.k.state == "completed" else "failed"

    def _fail(self, step: str) -> None:
        """``step`` failed for good: the run fails and its steps not started are cancelled."""
        self.steps[step].state = "failed"
        if self.state == "running":
            self.state = "failed"
            self._cancel_unstarted()

    def _cancel_unstarted(self) -> None:
        for s in self.steps.values():
            if s.state in ("blocked", "parked"):
                s.state = "cancelled"
        for i in (self.items or {}).values():
            if i.state == "blocked":
                i.state = "cancelled"

    # -- what the test does ------------------------------------------------------------

    def release(self, step: str, verdict: str) -> None:
        """The current execution of ``step`` (active) finishes or raises."""
        s = self.step(step)
        assert s.state == "active", (self.tag, step, s)
        if self.purged:
            return
        if verdict == "finish":
            s.state = "completed"
        else:
            s.failures += 1
            if s.failures >= ATTEMPTS[step]:
                self._fail_for_good(step)
            elif self.state_of(step) != "running":
                s.state = "cancelled"
        if step == KID_STEP and s.state != "active":
            self._end_kid()

    def _fail_for_good(self, step: str) -> None:
        if step in ITEMS:
            self.step(step).state = "failed"
            if self.steps["m"].state == "parked" and ITEM_FAILS_NODE["on"]:
                self._fail("m")  # the item's failure fails its node, and so the run
            elif self.steps["m"].state == "parked":
                self.state = "failed"
                self._cancel_unstarted()
            return
        if step == KID_STEP:
            self.k.state = "failed"
            self._end_kid()
        else:
            self._fail(step)

    def lose(self, step: str) -> None:
        """The worker running ``step`` died or froze: the leader hands the job back."""
        s = self.step(step)
        assert s.state == "active", (self.tag, step, s)
        s.lost += 1
        if self.state_of(step) != "running":
            s.state = "cancelled"
        elif s.lost >= LOSSES:
            self._fail_for_good(step)

    def hand_back(self, step: str) -> None:
        """The worker running ``step`` stops and hands it back: claimed again, or, its run
        ended, cancelled."""
        if self.state_of(step) != "running":
            self.step(step).state = "cancelled"

    def cancel(self) -> str | None:
        if self.purged:
            return Expect.NOT_FOUND
        if self.state != "running":
            return Expect.INVALID_STATE
        self.state = "cancelled"
        self._cancel_unstarted()
        if self.kid == "running":  # the cancel cascades to the running kid
            self.kid = "cancelled"
            if self.k.state == "blocked":
                self.k.state = "cancelled"
        return None

    def cancel_kid(self) -> str | None:
        """Cancel the kid by its own handle: that attempt of ``c`` fails (naming it); the
        next runs the kid again, and the last fails ``c`` and so the run."""
        if self.kid != "running":
            return Expect.INVALID_STATE
        self.kid = "cancelled"
        if self.k.state == "blocked":
            self.k.state = "cancelled"
        self.advance()
        return None

    def retry_kid(self) -> str | None:
        """Retry the kid by its own handle (its failed or cancelled step), whatever its
        parent does: a later attempt of ``c`` finds it running, or ended, anew."""
        if self.kid not in ("failed", "cancelled") or self.k.state == "active":
            return Expect.INVALID_STATE
        if self.k.state in ("failed", "cancelled"):
            self.k = StepModel()
        self.kid = "completed" if self.k.state == "completed" else "running"
        self.advance()
        return None

    def retry_alternatives(self, *, every_step: bool) -> tuple[str | None, list[RunModel]]:
        """What ``retry`` (``retry_all``) returns, and the models it may leave: ``c`` and
        ``m`` (or ``m``'s items) made runnable by the same retry race (``c`` failing the
        run at once cancels those not claimed yet)."""
        first = self.copy()
        outcome = first.retry(every_step=every_step, map_first=True)
        this = self.copy()
        assert this.retry(every_step=every_step) == outcome
        return outcome, [this, first]

    def retry(self, *, every_step: bool, map_first: bool = False) -> str | None:
        sources = TERMINAL if every_step else ("failed", "cancelled")
        if self.purged:
            return Expect.NOT_FOUND
        if self.state not in sources or self.deadline_passed:
            return Expect.INVALID_STATE
        if any(s.state == "active" for s in self.steps.values()) or self.items_active():
            return Expect.INVALID_STATE
        reset = ("completed", "failed", "cancelled") if every_step else ("failed", "cancelled")
        for s in self.steps.values():
            if s.state in reset:
                s.state, s.failures, s.lost = "blocked", 0, 0
        if every_step:
            self.items = None  # the map node expands anew
        for i in (self.items or {}).values():
            if i.state in reset:  # only the failed and cancelled items run again
                i.state, i.failures, i.lost = "blocked", 0, 0
        self.timer = False
        self.state = "running"
        self.advance(map_first)
        return None

    def fork_refused(self) -> str | None:
        """What ``fork`` of this run raises, if it is refused."""
        if self.purged:
            return Expect.NOT_FOUND
        if (
            self.state == "running"
            or any(s.state == "active" for s in self.steps.values())
            or self.items_active()
        ):
            return Expect.INVALID_STATE
        return None

    def fork(self, number: int, key: str, rerun: str | None) -> RunModel:
        """The fork of this (ended) run under ``key``: the steps it completed keep their
        outputs, but ``rerun`` and those downstream of it; a kept map node keeps its
        (completed) items, one the fork runs again expands anew."""
        fork = RunModel(
            number=number,
            key=key,
            v=self.v,
            deadline=False,
            retention0=self.retention0,
            input_tag=self.input_tag,
        )
        again = DOWNSTREAM[rerun] if rerun else set()
        for step in STEPS:
            if step not in again and self.steps[step].state == "completed":
                fork.steps[step].state = "completed"
        if fork.steps["m"].state == "completed":
            fork.items = {i: StepModel(state="completed") for i in ITEMS}
        return fork.advance()

    def signal_outcome(self, payload: int) -> bool | str:
        """What sending ``go`` with ``payload`` returns (True, False) or raises."""
        if self.purged:
            return Expect.NOT_FOUND
        if self.signal is not None:
            return False if self.signal == payload else Expect.CONFLICT
        if self.state != "running":
            return Expect.INVALID_STATE
        return True

    def send(self, payload: int) -> bool | str:
        outcome = self.signal_outcome(payload)
        if outcome is True:
            self.signal = payload
            self.advance()
        return outcome

    def time_passes(self) -> list[RunModel]:
        """A day passes for this run: its deadline and ``w``'s timeout, if running, pass.

        With both due, the deadline sweep and the worker timing ``w`` out race: either
        fails the run.
        """
        if self.purged:
            return [self]
        timing_out = self.state == "running" and self.steps["w"].state == "parked"
        if not self.deadline:
            if timing_out:
                self.timer = True
                self.advance()
            return [self]
        self.deadline_passed = True
        if self.state != "running":
            return [self]
        expired = self.copy()
        expired.state = "failed"
        expired._cancel_unstarted()
        if not timing_out:
            return [expired]
        timed_out = self.copy()
        timed_out._fail("w")
        return [expired, timed_out]


def release_and_cancel(run: RunModel, step: str, verdict: str) -> list[tuple[RunModel, str | None]]:
    """Alternatives when ``cancel`` is sent right after releasing ``step``: the cancel can
    land before the outcome is recorded or after any of the steps of progress that
    follow. Each alternative comes with what its cancel returns."""
    alternatives: list[tuple[RunModel, str | None]] = []
    first = run.copy()
    outcome = first.cancel()
    first.release(step, verdict)
    first.advance()
    alternatives.append((first, outcome))
    later = run.copy()
    later.release(step, verdict)
    while True:
        branch = later.copy()
        outcome = branch.cancel()
        branch.advance()
        alternatives.append((branch, outcome))
        if not later.advance_one():
            break
    return alternatives
