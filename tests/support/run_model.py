"""The reference model of the model-based test (``tests/test_model.py``): pure Python.

One :class:`RunModel` per run of :data:`tests.support.model_proc.WORKFLOW` (``a -> w ->
b -> {c, m}``, ``c`` a child node, ``m`` a map node with two items ``m0`` and ``m1``), with
its tree of child runs (:class:`ChildModel`): the *kid* ``c`` makes (``g -> k``, ``g`` a
child node too) and the *grandkid* the kid's ``g`` makes (one step ``q``), says, from the
operations applied to it, what state the run, its children and each of their steps must
be in once the workers have done what they can (the test *settles* the database before
comparing). Each operation returns what the call must return or raise.

What the workers do on their own is a set of *moves* (:meth:`RunModel.enabled`), each
one transaction of a worker: a step claimed, a wait node parked, a child node claimed
(making, reading or retrying its child), woken by its child's end, a map node expanded,
an item claimed, a map node collecting. Workers make them in any order, so an operation
is followed by :meth:`RunModel.explore`: every state the moves may end in, whatever their
order (the canonical order first); where the real system races (a cancel sent while a
released step is being recorded, a retry that makes ``c`` and ``m`` runnable at once
while ``c`` fails the run, a deadline and a wait's timeout falling due together), there
are several, and the test keeps the one the database shows; none matching is a failure.

Step states: ``blocked`` (upstream not completed), ``active`` (claimed and waiting at
its gate, or available), ``queued`` (a step of :data:`LIMITED`, available but not
claimed: its lane's slot is held by another step, see
:data:`tests.support.model_proc.LANE`; or a step of :data:`SIDE_STEPS`, available but
not claimed while their queue is paused: :data:`SIDE_PAUSED`),
``parked`` (``w`` waiting for its signal, ``c`` and ``g`` for their child to end, ``m``
for its items), and the terminal ``completed``,
``failed``, ``cancelled``. A child run is ``none`` until its node first parks; then a run state of
its own, with its steps' states. The items are ``none`` until ``m`` first expands (and
again after a ``retry_all``); each then has a step's states and attempts of its own.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
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
KID_STEP = "k"
"""The kid's gated step (after its child node ``g``)."""
KID_NODE = "g"
"""The kid's child node, whose child is the grandkid."""
GRAND_STEP = "q"
"""The grandkid's one (gated) step."""
LIMITED = ("b", KID_STEP)
"""The steps (the run's ``b``, its kid's ``k``) under the lane's ``Concurrency(1)``: once
runnable, each is claimed (``active``) or waits for the slot (``queued``), as the other
runs of its lane let it.
A run's model cannot tell which (the slot is shared with other runs): it allows both,
and lets a ``queued`` step become ``active`` whenever the test sees it so (the slot
freed by another run: :meth:`RunModel.promotions`); the test's settle checks that a step
waits only while its lane's slot is held."""
SIDE_STEPS = (*LIMITED, "q")
"""The steps that run in the *side queue* (:data:`tests.support.model_proc.SIDE_QUEUE`):
the steps of :data:`LIMITED` and the grandkid's ``q``."""
SIDE_PAUSED = {"on": False}
"""Whether the side queue is paused (the test sets it as it pauses and resumes the
queue): no worker claims its steps then, so once runnable (made, failed with an attempt
left, rescued, handed back) they wait ``queued``, whatever their lane's slot, and a
``queued`` step is not promoted."""
KID_STEPS = (KID_NODE, KID_STEP)
GRAND_STEPS = (GRAND_STEP,)
LEVELS = ("kid", "grand")
"""The child runs of a run's tree, from the top."""
ATTEMPTS = {"a": 2, "w": 1, "b": 2, "c": 2, "g": 2, "k": 2, "q": 2, "m0": 2, "m1": 2, "h": 2}
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
class ChildModel:
    """A child run: the kid (steps ``g -> k``, ``child`` the grandkid once ``g`` made it)
    or the grandkid (one step ``q``). It runs on its own, whatever its parent does: a
    parent that fails or passes its deadline leaves it running; only a cancel cascades
    (docs/children.md)."""

    steps: dict[str, StepModel]
    state: str = "running"
    child: ChildModel | None = None

    @classmethod
    def kid(cls) -> ChildModel:
        return cls({s: StepModel() for s in KID_STEPS})

    @classmethod
    def grand(cls) -> ChildModel:
        return cls({s: StepModel() for s in GRAND_STEPS})

    def active(self) -> bool:
        """Whether a step of it runs (a retry of it is refused)."""
        return any(s.state == "active" for s in self.steps.values())

    def tree_running(self) -> bool:
        """Whether it or a run below it still runs (its top parent is not purged)."""
        return self.state == "running" or (self.child is not None and self.child.tree_running())

    def end_if_done(self) -> None:
        """Its last step completed: it completes, in that step's transaction."""
        if self.state == "running" and all(s.state == "completed" for s in self.steps.values()):
            self.state = "completed"

    def fail(self, step: str) -> None:
        """``step`` failed for good: it fails, its steps not started cancelled (its own
        child, if running, runs on)."""
        self.steps[step].state = "failed"
        if self.state == "running":
            self.state = "failed"
            cancel_unstarted(self.steps.values())

    def cancel_tree(self) -> None:
        """A cancel reaching it: it, its steps not started and its running child,
        recursively (a cancel goes down through running runs only)."""
        if self.state != "running":
            return
        self.state = "cancelled"
        cancel_unstarted(self.steps.values())
        if self.child is not None:
            self.child.cancel_tree()

    def restart(self, *, every_step: bool, by_handle: bool = False) -> str | None:
        """``retry`` (its failed and cancelled steps) or ``retry_all`` (every step) by its
        own handle, or by its node's later attempt (``retry``): refused for a run not in
        a state it starts from, or with a step still running; by its handle, also while
        a step of its own ended child still runs. A run whose steps have all completed is
        completed at once."""
        sources = TERMINAL if every_step else ("failed", "cancelled")
        if self.state not in sources or self.active():
            return Expect.INVALID_STATE
        if by_handle and ended_and_active(self.child):
            return Expect.INVALID_STATE
        reset = TERMINAL if every_step else ("failed", "cancelled")
        for s in self.steps.values():
            if s.state in reset:
                s.state, s.failures, s.lost = "blocked", 0, 0
        self.state = "running"
        self.end_if_done()
        return None


def ended_and_active(child: ChildModel | None) -> bool:
    """Whether ``child`` ended (failed or cancelled) with a step still running: a retry of
    its parent by a handle is refused (its node, run again, could not retry it)."""
    return child is not None and child.state in ("failed", "cancelled") and child.active()


def cancel_unstarted(steps: Iterable[StepModel]) -> None:
    """Cancel the steps not started (blocked, parked, or queued: not claimed yet)."""
    for s in steps:
        if s.state in ("blocked", "parked", "queued"):
            s.state = "cancelled"


def claim_node(child: ChildModel | None, make: Callable[[], ChildModel]) -> tuple[ChildModel, str]:
    """A child node is claimed: it makes its child and parks, or (a later attempt, or a
    retry of its run) reads the child it made: completed, the node completes (its output
    the child's result); running, it parks; failed or cancelled, it retries the child
    (its failed and cancelled steps, attempts reset) and parks, unless a step of the
    child still runs (cancelled while at its gate): then each attempt fails at once, and
    the node fails. The child and the node's outcome: ``parked``, ``completed`` or
    ``failed``."""
    if child is None:
        return make(), "parked"
    if child.state == "completed":
        return child, "completed"
    if child.state != "running" and child.restart(every_step=False) is not None:
        return child, "failed"
    return child, "parked"


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
    kid: ChildModel | None = None
    """The child run ``c`` made (None: not made yet), with its own child."""
    items: dict[str, StepModel] | None = None
    """``m``'s items (None: not expanded)."""

    def __post_init__(self) -> None:
        self.input_tag = self.input_tag or self.tag

    @property
    def tag(self) -> str:
        return f"m{self.number}"

    def copy(self) -> RunModel:
        return copy.deepcopy(self)

    def key_of_state(self) -> str:
        """Everything the model holds, as a string (to tell states apart while exploring)."""
        return repr(self)

    @property
    def grand(self) -> ChildModel | None:
        return self.kid.child if self.kid is not None else None

    def child_at(self, level: str) -> ChildModel | None:
        """The child run at ``level`` (``kid`` or ``grand``) of this run's tree, if made."""
        return self.kid if level == "kid" else self.grand

    def tree_running(self) -> bool:
        """Whether a run of this run's tree of children still runs."""
        return self.kid is not None and self.kid.tree_running()

    def summary(self) -> dict[str, str]:
        kid, grand = self.kid, self.grand
        return {
            "run": self.state,
            **{s: self.steps[s].state for s in STEPS},
            "kid": kid.state if kid else "none",
            **{s: kid.steps[s].state if kid else "none" for s in KID_STEPS},
            "grand": grand.state if grand else "none",
            **{s: grand.steps[s].state if grand else "none" for s in GRAND_STEPS},
            **{i: self.items[i].state if self.items else "none" for i in ITEMS},
        }

    def owner(self, step: str) -> ChildModel | None:
        """The child run ``step`` is a step of (None: a step of this run, or an item)."""
        if step in KID_STEPS:
            assert self.kid is not None, (self.tag, step)
            return self.kid
        if step in GRAND_STEPS:
            assert self.grand is not None, (self.tag, step)
            return self.grand
        return None

    def step(self, step: str) -> StepModel:
        if step in ITEMS:
            assert self.items is not None, (self.tag, step)
            return self.items[step]
        owner = self.owner(step)
        return owner.steps[step] if owner is not None else self.steps[step]

    def items_active(self) -> bool:
        return self.items is not None and any(i.state == "active" for i in self.items.values())

    def state_of(self, step: str) -> str:
        """The state of the run ``step`` belongs to (a child's for its steps)."""
        owner = self.owner(step)
        return owner.state if owner is not None else self.state

    # -- progress that workers make on their own ---------------------------------------

    def enabled(self) -> list[str]:
        """The moves the workers may make next, in the canonical order (each one
        transaction of a worker; a child run moves whatever its parent's state)."""
        if self.purged:
            return []
        moves = []
        kid, grand = self.kid, self.grand
        if grand is not None and grand.state == "running" and grand.steps["q"].state == "blocked":
            moves.append("queue q" if SIDE_PAUSED["on"] else "claim q")
        if kid is not None and kid.state == "running":
            g, k = kid.steps["g"], kid.steps["k"]
            if g.state == "blocked":
                moves.append("claim g")
            if g.state == "parked" and grand is not None and grand.state != "running":
                moves.append("wake g")
            if k.state == "blocked" and g.state == "completed":
                if not SIDE_PAUSED["on"]:
                    moves.append("claim k")
                moves.append("queue k")  # its lane's slot held by another step, or paused
        if self.state != "running":
            return moves
        a, w, b, c, m = (self.steps[s] for s in STEPS)
        if a.state == "blocked":
            moves.append("claim a")
        if w.state == "blocked" and a.state == "completed":
            moves.append("claim w")
        if w.state == "parked" and self.signal is not None:
            moves.append("deliver w")
        elif w.state == "parked" and self.timer:
            moves.append("time out w")
        if b.state == "blocked" and w.state == "completed":
            if not SIDE_PAUSED["on"]:
                moves.append("claim b")
            moves.append("queue b")  # its lane's slot held by another run, or paused
        if c.state == "blocked" and b.state == "completed":
            moves.append("claim c")
        if c.state == "parked" and kid is not None and kid.state != "running":
            moves.append("wake c")
        if m.state == "blocked" and b.state == "completed":
            moves.append("expand m")
        for i, item in (self.items or {}).items():
            if item.state == "blocked":  # made or reset by a retry: available, claimed
                moves.append(f"claim {i}")
        if (
            m.state == "parked"
            and self.items is not None
            and all(i.state == "completed" for i in self.items.values())
        ):
            moves.append("collect m")  # the last item made it runnable: it collects
        return moves

    def apply(self, move: str) -> None:
        """Make ``move`` (one of :meth:`enabled`)."""
        kid = self.kid
        if move == "claim g":
            assert kid is not None
            self._claim_node(kid, "g")
        elif move == "wake g":
            assert kid is not None
            self._wake_node(kid, "g")
        elif move == "claim c":
            self._claim_node(None, "c")
        elif move == "wake c":
            self._wake_node(None, "c")
        elif move == "claim w":
            self.steps["w"].state = "completed" if self.signal is not None else "parked"
            self.timer = False
        elif move == "deliver w":
            self.steps["w"].state = "completed"
        elif move == "time out w":
            self.timer = False
            self._fail("w")
        elif move == "expand m":
            if self.items is None:  # one job per item, available
                self.items = {i: StepModel() for i in ITEMS}
            done = all(i.state == "completed" for i in self.items.values())
            self.steps["m"].state = "completed" if done else "parked"
        elif move == "collect m":
            self.steps["m"].state = "completed"
        else:
            verb, step = move.split()
            assert verb in ("claim", "queue"), move
            self.step(step).state = "active" if verb == "claim" else "queued"
        self._end_if_done()

    def _claim_node(self, owner: ChildModel | None, node: str) -> None:
        """Child node ``node`` (``c`` of this run, or ``g`` of the kid ``owner``) is claimed."""
        if owner is None:
            self.kid, outcome = claim_node(self.kid, ChildModel.kid)
            if outcome == "failed":
                self._fail("c")
            else:
                self.steps["c"].state = outcome
        else:
            owner.child, outcome = claim_node(owner.child, ChildModel.grand)
            if outcome == "failed":
                owner.fail(node)
            else:
                owner.steps[node].state = outcome

    def _wake_node(self, owner: ChildModel | None, node: str) -> None:
        """Child node ``node``, parked, is woken by its child's end: completed, it
        completes; failed or cancelled, that attempt fails (naming the child), and the
        next (no backoff) runs the child again, or the last fails the node."""
        child = self.kid if owner is None else owner.child
        s = self.steps[node] if owner is None else owner.steps[node]
        assert child is not None
        if child.state == "completed":
            s.state = "completed"
            return
        s.failures += 1
        if s.failures < ATTEMPTS[node]:
            self._claim_node(owner, node)
        elif owner is None:
            self._fail(node)
        else:
            owner.fail(node)

    def _end_if_done(self) -> None:
        """Each run of the tree whose last step completed completes (in that step's
        transaction)."""
        for run in (self.grand, self.kid):
            if run is not None:
                run.end_if_done()
        if self.state == "running" and all(s.state == "completed" for s in self.steps.values()):
            self.state = "completed"

    def promotions(self) -> list[RunModel]:
        """This model with some of its ``queued`` steps claimed (their slot freed since, or
        their queue resumed): each way of choosing them, none while their queue is paused
        (a run's ``b`` and its grandkid's ``q`` may both wait, and only ``q`` run once the
        queue resumes, ``b``'s lane's slot held)."""
        queued = [s for s in SIDE_STEPS if self.owns(s) and self.step(s).state == "queued"]
        if SIDE_PAUSED["on"]:
            return []
        found = []
        for n in range(1, len(queued) + 1):
            for chosen in itertools.combinations(queued, n):
                after = self.copy()
                for step in chosen:
                    after.step(step).state = "active"
                found.append(after)
        return found

    def owns(self, step: str) -> bool:
        """Whether the run, child run or map node ``step`` belongs to has it (its kid, its
        grandkid made; its items made)."""
        if step in KID_STEPS:
            return self.kid is not None
        if step in GRAND_STEPS:
            return self.grand is not None
        if step in ITEMS:
            return self.items is not None
        return step in STEPS

    def advance(self) -> RunModel:
        """Make the enabled moves in the canonical order until none is left."""
        while moves := self.enabled():
            self.apply(moves[0])
        return self

    def explore(self) -> list[RunModel]:
        """Every state the workers may leave this run in, whatever the order of their
        moves (:meth:`advance`'s first)."""
        canonical = self.copy().advance()
        finals = {canonical.key_of_state(): canonical}
        seen: set[str] = set()
        todo = [self]
        while todo:
            model = todo.pop()
            key = model.key_of_state()
            if key in seen:
                continue
            seen.add(key)
            moves = model.enabled()
            if not moves:
                finals.setdefault(key, model)
            for move in moves:
                after = model.copy()
                after.apply(move)
                todo.append(after)
        return list(finals.values())

    def _fail(self, step: str) -> None:
        """``step`` failed for good: the run fails and its steps not started are cancelled
        (its children run on)."""
        self.steps[step].state = "failed"
        if self.state == "running":
            self.state = "failed"
            self._cancel_unstarted()

    def _cancel_unstarted(self) -> None:
        cancel_unstarted(self.steps.values())
        cancel_unstarted((self.items or {}).values())

    # -- what the test does ------------------------------------------------------------

    def release(self, step: str, verdict: str) -> None:
        """The current execution of ``step`` (active) finishes or raises (an attempt left
        and its run running: claimed again, or, for a step of :data:`LIMITED`, available
        again, as a new one, claimed or queued behind another run's step that the slot
        it freed went to; queued while the side queue is paused)."""
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
            elif step in LIMITED or (step in SIDE_STEPS and SIDE_PAUSED["on"]):
                s.state = "blocked"
        self._end_if_done()

    def _fail_for_good(self, step: str) -> None:
        if step in ITEMS:
            self.step(step).state = "failed"
            if self.steps["m"].state == "parked" and ITEM_FAILS_NODE["on"]:
                self._fail("m")  # the item's failure fails its node, and so the run
            elif self.steps["m"].state == "parked":
                self.state = "failed"
                self._cancel_unstarted()
            return
        owner = self.owner(step)
        if owner is not None:
            owner.fail(step)
        else:
            self._fail(step)

    def lose(self, steps: list[str]) -> None:
        """The worker running ``steps`` died or froze: the leader rescues their jobs in
        one statement, each reading the state its run had before it: cancelled (its run
        ended), failed (lost too often), else available again (claimed by a live
        worker). The failed ones then fail their run, which cancels the others not
        claimed yet (the rescue made them available in the same transaction)."""
        before = {step: self.state_of(step) for step in steps}
        given_up = []
        for step in steps:
            s = self.step(step)
            assert s.state == "active", (self.tag, step, s)
            s.lost += 1
            if before[step] != "running":
                s.state = "cancelled"
            elif s.lost >= LOSSES:
                given_up.append(step)
            else:
                s.state = "blocked"  # available again: a move claims it
        for step in given_up:
            self._fail_for_good(step)

    def hand_back(self, step: str) -> None:
        """The worker running ``step`` stops and hands it back: claimed again, or, its run
        ended, cancelled; a step of :data:`LIMITED` available again may find its slot
        taken by another run's step meanwhile (so, as a new one, claimed or queued); a step
        of the side queue, while it is paused, waits queued."""
        if self.state_of(step) != "running":
            self.step(step).state = "cancelled"
        elif step in LIMITED or (step in SIDE_STEPS and SIDE_PAUSED["on"]):
            self.step(step).state = "blocked"

    def cancel(self) -> str | None:
        if self.purged:
            return Expect.NOT_FOUND
        if self.state != "running":
            return Expect.INVALID_STATE
        self.state = "cancelled"
        self._cancel_unstarted()
        if self.kid is not None:  # the cancel cascades to the running kid, and its child
            self.kid.cancel_tree()
        return None

    def cancel_child(self, level: str) -> str | None:
        """Cancel the child run at ``level`` by its own handle (with its running child):
        the node waiting for it fails that attempt (naming it); the next runs it again,
        and the last fails the node and so the run above."""
        child = self.child_at(level)
        assert child is not None, (self.tag, level)
        assert not self.purged, self.tag
        if child.state != "running":
            return Expect.INVALID_STATE
        child.cancel_tree()
        return None

    def retry_child(self, level: str, *, every_step: bool) -> str | None:
        """``retry`` or ``retry_all`` of the child run at ``level`` by its own handle,
        whatever its parent does: a later attempt of its node finds it running, or ended,
        anew; a node that completed keeps the result it read."""
        child = self.child_at(level)
        assert child is not None, (self.tag, level)
        assert not self.purged, self.tag
        return child.restart(every_step=every_step, by_handle=True)

    def retry_alternatives(self, *, every_step: bool) -> tuple[str | None, list[RunModel]]:
        """What ``retry`` (``retry_all``) returns, and the models it may leave (the moves
        it makes possible race: ``c`` failing the run at once cancels the steps and items
        not claimed yet)."""
        retried = self.copy()
        outcome = retried.retry(every_step=every_step)
        return outcome, retried.explore() if outcome is None else [self]

    def retry(self, *, every_step: bool) -> str | None:
        sources = TERMINAL if every_step else ("failed", "cancelled")
        if self.purged:
            return Expect.NOT_FOUND
        if self.state not in sources or self.deadline_passed:
            return Expect.INVALID_STATE
        if any(s.state == "active" for s in self.steps.values()) or self.items_active():
            return Expect.INVALID_STATE
        if ended_and_active(self.kid):
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
        self._end_if_done()
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
        fork._end_if_done()  # nothing to run again: completed at once
        return fork

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
            self.timer = self.timer or timing_out
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


def lost_with_worker(run: RunModel, steps: list[str]) -> list[RunModel]:
    """The states ``run`` may end in when the worker running its ``steps`` dies or
    freezes: the leader rescues them together (:meth:`RunModel.lose`), or, their
    heartbeats not stale at the same pass, one at a time, in either order, the workers
    moving in between."""
    together = run.copy()
    together.lose(steps)
    ends = {end.key_of_state(): end for end in together.explore()}
    if len(steps) > 1:
        for order in itertools.permutations(steps):
            events = [functools.partial(RunModel.lose, steps=[step]) for step in order]
            for end in interleave(run, events):
                ends.setdefault(end.key_of_state(), end)
    return list(ends.values())


def interleave(run: RunModel, events: Sequence[Callable[[RunModel], object]]) -> list[RunModel]:
    """The states ``run`` may end in when ``events`` happen to it in this order, each
    before or after any of the workers' moves."""
    ends: dict[str, RunModel] = {}
    seen: set[tuple[str, int]] = set()
    todo = [(run.copy(), 0)]
    while todo:
        model, done = todo.pop()
        if (model.key_of_state(), done) in seen:
            continue
        seen.add((model.key_of_state(), done))
        moves = model.enabled()
        if done == len(events) and not moves:
            ends.setdefault(model.key_of_state(), model)
        if done < len(events):
            after = model.copy()
            events[done](after)
            todo.append((after, done + 1))
        for move in moves:
            after = model.copy()
            after.apply(move)
            todo.append((after, done))
    return list(ends.values())


def release_and_cancel(
    run: RunModel, step: str, verdict: str, level: str | None = None
) -> list[tuple[RunModel, str | None]]:
    """Alternatives when ``cancel`` of the run (or of its child at ``level``, by its own
    handle) is sent right after releasing ``step``: the cancel can land before the
    outcome is recorded or after any of the moves that follow, in any order. Each
    alternative comes with what its cancel returns."""
    found: dict[tuple[str, str | None], tuple[RunModel, str | None]] = {}

    def cancel(model: RunModel) -> str | None:
        return model.cancel() if level is None else model.cancel_child(level)

    def cancelled_at(model: RunModel) -> None:
        branch = model.copy()
        outcome = cancel(branch)
        for end in branch.explore():
            found.setdefault((end.key_of_state(), outcome), (end, outcome))

    first = run.copy()
    outcome = cancel(first)
    first.release(step, verdict)
    for end in first.explore():
        found.setdefault((end.key_of_state(), outcome), (end, outcome))
    released = run.copy()
    released.release(step, verdict)
    seen: set[str] = set()
    todo = [released]
    while todo:
        model = todo.pop()
        if model.key_of_state() in seen:
            continue
        seen.add(model.key_of_state())
        cancelled_at(model)
        for move in model.enabled():
            after = model.copy()
            after.apply(move)
            todo.append(after)
    return list(found.values())


# -- the limited workflow ---------------------------------------------------------------

SLOT_STEP = "h"
"""The one (gated) step of :data:`tests.support.model_proc.SLOT`."""


@dataclass
class SlotRun:
    """A run of :data:`tests.support.model_proc.SLOT` (``s<N>``): ``held`` (submitted, or
    retried never started, and not admitted), ``running`` (admitted: in progress), or
    ended. Its step ``h`` is ``none`` until the run starts (a held run has no steps),
    then a step's states (``active``: claimed and waiting at its gate)."""

    number: int
    key: int
    deadline: bool
    order: int
    state: str = "held"
    step: StepModel = field(default_factory=lambda: StepModel(state="none"))
    started: bool = False
    deadline_passed: bool = False
    purged: bool = False

    @property
    def tag(self) -> str:
        return f"s{self.number}"

    def summary(self) -> dict[str, str] | None:
        if self.purged:
            return None
        return {
            "run": self.state,
            "started": "yes" if self.started else "no",
            SLOT_STEP: self.step.state,
        }


@dataclass
class SlotModel:
    """The runs of the limited workflow, whose keys admit their held runs (oldest held
    first, by when they were held) while they have fewer than ``max`` runs in progress.
    The workers admit at once (the test settles until no key with room holds a run), so
    every operation is followed by :meth:`admit`, and the model is one state: each rule
    on these runs is sequential (no race left to the workers)."""

    runs: dict[int, SlotRun] = field(default_factory=dict)
    max: int = 1
    holds: int = 0
    """Holds so far (a run's ``order``: its place in its key's queue)."""

    def copy(self) -> SlotModel:
        return copy.deepcopy(self)

    def in_progress(self, key: int) -> list[SlotRun]:
        return [
            r for r in self.runs.values() if not r.purged and r.state == "running" and r.key == key
        ]

    def held(self, key: int) -> list[SlotRun]:
        return sorted(
            (r for r in self.runs.values() if not r.purged and r.state == "held" and r.key == key),
            key=lambda r: r.order,
        )

    def admit(self) -> None:
        for key in sorted({r.key for r in self.runs.values()}):
            room = max(0, self.max - len(self.in_progress(key)))
            for run in self.held(key)[:room]:
                run.state, run.started = "running", True
                run.step = StepModel(state="active")  # started: claimed at its gate

    def hold(self, run: SlotRun) -> None:
        self.holds += 1
        run.order = self.holds
        run.state = "held"

    def submit(self, number: int, key: int, deadline: bool) -> SlotRun:
        run = SlotRun(number=number, key=key, deadline=deadline, order=0)
        self.runs[number] = run
        self.hold(run)
        self.admit()
        return run

    def cancel(self, number: int) -> str | None:
        run = self.runs[number]
        if run.purged:
            return Expect.NOT_FOUND
        if run.state not in ("held", "running"):
            return Expect.INVALID_STATE
        run.state = "cancelled"  # a step at its gate runs on (its job running)
        self.admit()
        return None

    def summaries(self) -> dict[str, dict[str, str] | None]:
        return {r.tag: r.summary() for r in self.runs.values()}

    def retry(self, number: int, *, every_step: bool) -> str | None:
        """``retry`` (``retry_all``): a run never started is held again (behind the runs
        held now); one started restarts in progress if its key has room, else is
        refused."""
        run = self.runs[number]
        sources = TERMINAL if every_step else ("failed", "cancelled")
        if run.purged:
            return Expect.NOT_FOUND
        if run.state not in sources or run.deadline_passed or run.step.state == "active":
            return Expect.INVALID_STATE
        if not run.started:
            self.hold(run)
        elif len(self.in_progress(run.key)) >= self.max:
            return Expect.INVALID_STATE
        else:
            reset = TERMINAL if every_step else ("failed", "cancelled")
            if run.step.state in reset:
                run.step = StepModel(state="active")
            run.state = "completed" if run.step.state == "completed" else "running"
        self.admit()
        return None

    def fork(self, source: int, number: int, *, rerun: bool) -> str | None:
        """The fork ``number`` of the run ``source`` (ended, its step not running), running
        ``h`` again (``rerun``) or not: a fork with a step to run (``h`` run again, or not
        completed in the source) is a run in progress of the source's key, made only if
        the key has room (refused otherwise); one with none completes at once."""
        run = self.runs[source]
        if run.purged:
            return Expect.NOT_FOUND
        if run.state in ("held", "running") or run.step.state == "active":
            return Expect.INVALID_STATE
        starts = rerun or run.step.state != "completed"
        if starts and len(self.in_progress(run.key)) >= self.max:
            return Expect.INVALID_STATE
        fork = SlotRun(number=number, key=run.key, deadline=False, order=0, started=True)
        if starts:
            fork.state, fork.step = "running", StepModel(state="active")
        else:
            fork.state, fork.step = "completed", StepModel(state="completed")
        self.runs[number] = fork
        self.admit()
        return None

    def release(self, number: int, verdict: str, *, admit: bool = True) -> None:
        run = self.runs[number]
        s = run.step
        assert s.state == "active", (run.tag, s)
        if run.purged:
            return
        if verdict == "finish":
            s.state = "completed"
            if run.state == "running":
                run.state = "completed"
        else:
            s.failures += 1
            if s.failures >= ATTEMPTS[SLOT_STEP]:
                s.state = "failed"
                if run.state == "running":
                    run.state = "failed"
            elif run.state != "running":
                s.state = "cancelled"
        if admit:
            self.admit()

    def lose(self, number: int, times: int = 1) -> None:
        """The worker running ``h`` died or froze (``times`` rescues): cancelled if its
        run ended, failed (and its run) when lost too often, else claimed again."""
        run = self.runs[number]
        for _ in range(times):
            assert run.step.state == "active", (run.tag, run.step)
            run.step.lost += 1
            if run.state != "running":
                run.step.state = "cancelled"
            elif run.step.lost >= LOSSES:
                run.step.state = run.state = "failed"
        self.admit()

    def hand_back(self, number: int) -> None:
        run = self.runs[number]
        if run.state != "running":
            run.step.state = "cancelled"

    def time_passes(self, number: int) -> None:
        """A day passes for the run: past its deadline (if it has one), held or in
        progress, it fails (a step at its gate runs on)."""
        run = self.runs[number]
        if run.purged or not run.deadline:
            return
        run.deadline_passed = True
        if run.state in ("held", "running"):
            run.state = "failed"
        self.admit()

    def over(self) -> bool:
        """Whether a key has more runs in progress than ``max`` (lowered under them)."""
        return any(len(self.in_progress(k)) > self.max for k in {r.key for r in self.runs.values()})

    def set_max(self, top: int) -> None:
        self.max = top
        self.admit()

    def purge(self) -> int:
        """Purge every ended run (the test's ``purge`` of everything); how many."""
        doomed = [r for r in self.runs.values() if not r.purged and r.state in TERMINAL]
        for r in doomed:
            r.purged = True
        return len(doomed)


def finish_and_cancel_slot(
    model: SlotModel, running: int, cancelled: int
) -> list[tuple[SlotModel, str | None]]:
    """The states (and what the cancel returns) when the ``h`` of the run ``running``
    finishes while the test cancels the run ``cancelled``: that run itself (cancelled
    first: its ``h`` completes in the cancelled run; or completed first: the cancel is
    refused), or the run held next for its key (cancelled held; or admitted, started and
    cancelled with its ``h`` claimed, or made and not claimed yet: cancelled with it)."""
    ends = []
    first = model.copy()
    got = first.cancel(cancelled)
    first.release(running, "finish")
    ends.append((first, got))
    then = model.copy()
    then.release(running, "finish")
    got = then.cancel(cancelled)
    ends.append((then, got))
    if then.runs[cancelled].started:  # admitted by the finish
        unclaimed = model.copy()
        unclaimed.release(running, "finish")
        unclaimed.runs[cancelled].step.state = "cancelled"
        got = unclaimed.cancel(cancelled)
        ends.append((unclaimed, got))
    return ends


def finish_and_retry_slot(
    model: SlotModel, running: int, retried: int, *, every_step: bool
) -> list[tuple[SlotModel, str | None]]:
    """The states (and what the retry returns) when the ``h`` of the run ``running``
    finishes while the test retries the ended run ``retried`` of its key: retried first
    (refused, the key full), or once the finish freed the slot, before the admission of
    the key's next held run (retried in progress, that one held still) or after it
    (refused)."""
    ends = []
    first = model.copy()
    got = first.retry(retried, every_step=every_step)
    first.release(running, "finish")
    ends.append((first, got))
    between = model.copy()
    between.release(running, "finish", admit=False)
    got = between.retry(retried, every_step=every_step)
    between.admit()  # (refused: the admission follows)
    ends.append((between, got))
    after = model.copy()
    after.release(running, "finish")
    got = after.retry(retried, every_step=every_step)
    ends.append((after, got))
    return ends
