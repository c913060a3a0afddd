"""The model-based test's workflow and worker process (``tests/test_model.py``).

``python -m tests.support.model_proc [URL]`` (else ``CYCLONE_MODEL_URL``) serves
:data:`WORKFLOW` with ``Worker.run()`` until SIGTERM (or SIGKILL/SIGSTOP from the test).
Its connections carry the application name ``model-<pid>``, so the test can tell which
worker holds what.

A run is told by its *tag*: the input's ``tag``, except for a fork (same input as the run
it came from), whose key ``fork-m<N>`` (``fork-s<N>`` for a run of :data:`SLOT`) names its
tag (:data:`TAG_SQL`).

The workflow is ``a -> w -> b -> {c, m}``: ``a`` and ``b`` are *gated* steps, ``w`` waits for
the signal ``go`` (with a one-day timeout that the test makes pass by moving timestamps),
``c`` is a child node: it submits a run of :data:`KID` (tagged ``<the run's tag>/kid``),
and completes as that child run does, or, when it fails or is cancelled, runs it again
in its second attempt and fails after that. The kid is ``g -> k``: ``g`` is a child node
of its own, as ``c`` is, whose run of :data:`GRAND` (the *grandkid*, tagged
``<the run's tag>/kid/kid``) has one gated step ``q``, and ``k`` is gated; ``m``
is a map node over ``b``'s list ``[0, 1]``: its two items, gated too, are told in
``model_exec`` as steps ``m0`` and ``m1`` (the node's name and the item's index).
``b`` runs under :data:`LANE`, a ``Concurrency(1)`` whose key is the run's *lane*
(:func:`lane_of` its number: ``m1``, ``m2`` and ``m3`` share one slot, ``m4`` to ``m6``
another, and a fork shares its source's, its input's tag), and so does the kid's ``k``
(the kid's lane is its top run's: a run's ``b`` and the kids' ``k`` of its lane draw
from one slot, a limit shared by name between two workflows): of two steps of a lane
that become runnable, one runs and the other waits ``available``, not claimed, until
the slot frees (its holder ends, is rescued, handed back or purged). ``b``, ``k`` and
``q`` run in a queue of their own, :data:`SIDE_QUEUE`, which the test pauses and resumes.
:data:`SLOT` is a second, small workflow limited as a whole: a ``Concurrency(1)`` of runs in
progress per key (:data:`SLOT_NAME`, key ``slot-<the input's v>``), one gated step ``h``;
its runs (tagged ``s<N>``) are submitted held and admitted by the workers as the key has
room (docs/flow-control.md, workflow limits).
Each execution of a gated step inserts a row into ``model_exec`` numbered per (tag,
step), then waits for the advisory lock :func:`gate` of that number, which the test
holds from the run's submission until it gives the execution its verdict (``finish``
or ``fail``, written to the row before the test unlocks the gate). So a step's
behaviour is decided by the test, with no sleep on either side.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from functools import cache

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

import cyclone

NAME = "model"
DAY = timedelta(days=1)
HEARTBEAT = timedelta(milliseconds=200)
RESCUE_AFTER = timedelta(seconds=1)
CONCURRENCY = 48
"""Step threads of each worker. Each execution waiting at its gate holds one: the
execution of each gated step that runs, and, on a worker frozen and thawed, the older
executions whose jobs were rescued meanwhile, until the test releases them. After every
rule the model has the workers claim all that is runnable: a worker whose threads all
wait at gates starts no run and claims no job, which the model does not model (its
settle then sees a run not started, or a job not claimed, as if a wake-up were lost).
16 threads were filled once in some 400 random examples (its one live worker left the
sixth run not started); the busiest worker of 320 others held 11 at once."""
MAX_ATTEMPTS = 2
"""Attempts of ``a``, ``b``, ``k``, ``q``, ``m``'s items, and of the child nodes ``c`` and
``g`` (a child node's further attempt runs its failed or cancelled child again); ``w``
has one (a wait node's default)."""
GATE_CLASS = 0x6D6F
STEP_NUMBER = {"a": 1, "b": 2, "k": 3, "m0": 4, "m1": 5, "q": 6, "h": 7}
MAP_ITEMS = 2
"""The length of ``b``'s list, so the number of ``m``'s items."""
KID_SUFFIX = "/kid"
"""A child run's tag: its parent's tag and this (a grandkid's: its kid's tag and this)."""
EXEC_DDL = (
    "CREATE TABLE IF NOT EXISTS model_exec (tag text NOT NULL, step text NOT NULL, "
    "n integer NOT NULL, pid integer NOT NULL, attempt integer NOT NULL, "
    "job_id bigint NOT NULL, lease bigint NOT NULL, verdict text, PRIMARY KEY (tag, step, n))"
)
"""``model_exec``: one row per execution of a gated step, with the worker's pid, the job
and the lease it was claimed under. The lease, not the attempt, tells the execution that
holds the job from an older one of the same job on the same worker: a rescue does not
count the attempt, so a worker frozen, rescued and thawed can claim its job again under
the same attempt while its first execution still waits at its gate. The job's id tells
it from an execution of a job since deleted and made again (a map node's items, when the
node runs again), whose first lease is the same."""


TAG_SQL = "coalesce(substring({r}.submit_key from '^fork-([ms][0-9]+)$'), {r}.input->>'tag')"
"""The tag of the run aliased ``{r}`` (format it with the alias), as SQL."""
FORK_PREFIX = "fork-"


class Item(msgspec.Struct):
    tag: str
    v: int = 0


LANE_NAME = "model.lane"
"""The name of :data:`LANE` (its row in ``cyclone_limits``)."""


def lane_of(number: int) -> str:
    """The lane of run ``m<number>``: three runs a lane (the first three runs, which an
    example starts with, contend for one slot)."""
    return f"lane-{(number - 1) // 3}"


def lane(item: Item) -> str:
    """The key of :data:`LANE` for a run of input ``item`` (a fork's input is its
    source's): the lane of the run its tag names."""
    return lane_of(int(item.tag.split("/")[0].removeprefix("m")))


LANE = cyclone.Concurrency(1, key=lane, name=LANE_NAME)
"""One ``b`` or ``k`` at once per lane, across every run, kid and worker (the test may
set the limit's ``max`` at runtime: ``Client.set_limit``)."""
SIDE_QUEUE = "model.side"
"""The *side queue*: that of ``b``, ``k`` (claimed under their lane's limit) and ``q`` (the
ordinary claim); every other step runs in the default queue. The test pauses and
resumes it, holding those steps available, not claimed."""


class StepFailed(Exception):
    """The failure the test asked a gated step for."""


def gate(tag: str, step: str, n: int) -> tuple[int, int]:
    """The advisory lock (two int4 keys) execution ``n`` of ``step`` of run ``tag`` waits for
    (a child run's ``k`` and a grandkid's ``q`` are told from the run's steps by the
    step's number; a run of :data:`SLOT`, ``s<N>``, by its step ``h``)."""
    number = int(tag.split("/")[0].removeprefix("m").removeprefix(SLOT_PREFIX))
    return GATE_CLASS, number * 1000 + STEP_NUMBER[step] * 100 + n


@cache
def engine() -> sa.Engine:
    # In the URL, not connect_args: the worker's own engines (leader, heartbeat) copy it.
    url = sa.make_url(os.environ["CYCLONE_MODEL_URL"]).update_query_dict(
        {"application_name": f"model-{os.getpid()}"}
    )
    # A connection for each execution at its gate (see CONCURRENCY), and the worker's own.
    return sa.create_engine(url, pool_size=CONCURRENCY + 4, max_overflow=10)


_INSERT = sa.text(
    "INSERT INTO model_exec (tag, step, n, pid, attempt, job_id, lease) "
    "SELECT :tag, :step, coalesce(max(n), 0) + 1, :pid, :attempt, :job_id, :lease "
    "FROM model_exec "
    "WHERE tag = :tag AND step = :step RETURNING n"
)


_TAG = sa.text(f"SELECT {TAG_SQL.format(r='r')} FROM cyclone_runs r WHERE r.id = :id")


def gated(ctx: cyclone.StepContext, item: Item, step: str) -> int:
    """Note this execution, wait at its gate, then do what the test decided."""
    with engine().connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        tag = conn.execute(_TAG, {"id": ctx.run_id}).scalar_one()
        params = {
            "tag": tag,
            "step": step,
            "pid": os.getpid(),
            "attempt": ctx.attempt,
            "job_id": ctx.job_id,
            # The claim's lease (private: the test needs to tell this execution from an
            # older one of the same job, see EXEC_DDL).
            "lease": ctx._lease,
        }
        while True:
            try:
                n = int(conn.execute(_INSERT, params).scalar_one())
                break
            except IntegrityError:
                continue  # another execution of the step took the number: take the next
        cls, key = gate(tag, step, n)
        conn.execute(sa.text("SELECT pg_advisory_lock_shared(:c, :k)"), {"c": cls, "k": key})
        conn.execute(sa.text("SELECT pg_advisory_unlock_shared(:c, :k)"), {"c": cls, "k": key})
        verdict = conn.execute(
            sa.text("SELECT verdict FROM model_exec WHERE tag = :tag AND step = :step AND n = :n"),
            {"tag": tag, "step": step, "n": n},
        ).scalar_one()
    if verdict == "fail":
        raise StepFailed(f"{tag}:{step} execution {n} failed as asked")
    assert verdict == "finish", verdict
    return n


def child_input(ctx: cyclone.StepContext) -> Item:
    """A child node's child's input: tagged from the tag of the node's run (a fork's is
    not its input's)."""
    with engine().connect() as conn:
        tag = conn.execute(_TAG, {"id": ctx.run_id}).scalar_one()
    return Item(tag=f"{tag}{KID_SUFFIX}")


GRAND: cyclone.Workflow[Item] = cyclone.Workflow(f"{NAME}_grand", input=Item)


@GRAND.step(max_attempts=MAX_ATTEMPTS, queue=SIDE_QUEUE)
def q(ctx: cyclone.StepContext, item: Item) -> int:
    return gated(ctx, item, "q")


KID: cyclone.Workflow[Item] = cyclone.Workflow(f"{NAME}_kid", input=Item)


@KID.child(GRAND, max_attempts=MAX_ATTEMPTS)
def g(ctx: cyclone.StepContext, item: Item) -> Item:
    return child_input(ctx)


@KID.step(after=[g], max_attempts=MAX_ATTEMPTS, concurrency=LANE, queue=SIDE_QUEUE)
def k(ctx: cyclone.StepContext, item: Item) -> int:
    return gated(ctx, item, "k")


WORKFLOW: cyclone.Workflow[Item] = cyclone.Workflow(NAME, input=Item)


@WORKFLOW.step(max_attempts=MAX_ATTEMPTS)
def a(ctx: cyclone.StepContext, item: Item) -> int:
    return gated(ctx, item, "a")


@WORKFLOW.wait("go", after=[a], timeout=DAY)
def w(ctx: cyclone.StepContext, payload: int) -> int:
    return payload


@WORKFLOW.step(after=[w], max_attempts=MAX_ATTEMPTS, concurrency=LANE, queue=SIDE_QUEUE)
def b(ctx: cyclone.StepContext, item: Item) -> list[int]:
    gated(ctx, item, "b")
    return list(range(MAP_ITEMS))


@WORKFLOW.map(over=b, max_attempts=MAX_ATTEMPTS)
def m(ctx: cyclone.StepContext, index: int) -> int:
    return gated(ctx, Item(tag=""), f"m{index}")


@WORKFLOW.child(KID, after=[b], max_attempts=MAX_ATTEMPTS)
def c(ctx: cyclone.StepContext, item: Item) -> Item:
    return child_input(ctx)


SLOT_NAME = "model.slot"
"""The name of :data:`SLOT`'s workflow limit (its row in ``cyclone_limits``)."""
SLOT_PREFIX = "s"
"""A run of :data:`SLOT` is tagged ``s<N>``."""


def slot_key(item: Item) -> str:
    """The key of :data:`SLOT`'s limit for a run of input ``item``."""
    return f"slot-{item.v}"


SLOT: cyclone.Workflow[Item] = cyclone.Workflow(
    f"{NAME}_slot",
    input=Item,
    concurrency=cyclone.Concurrency(1, key=slot_key, name=SLOT_NAME),
)
"""At most one run in progress per key (the test may set the limit's ``max`` at runtime):
the others are held (``start_at = 'infinity'``) until a worker admits them, oldest
first."""


@SLOT.step(max_attempts=MAX_ATTEMPTS)
def h(ctx: cyclone.StepContext, item: Item) -> int:
    return gated(ctx, item, "h")


def no_backoff(attempt: int) -> float:
    return 0.0


def main() -> None:
    cyclone.Worker(
        engine(),
        workflows=[WORKFLOW, KID, GRAND, SLOT],
        concurrency=CONCURRENCY,
        poll_interval=0.5,
        heartbeat_interval=HEARTBEAT,
        rescue_after=RESCUE_AFTER,
        backoff=no_backoff,
        sweep=False,
    ).run()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        os.environ["CYCLONE_MODEL_URL"] = sys.argv[1]
    main()
