"""A recovery workflow: find failed runs, keep them, and undo their effects exactly once.

Run it directly with
``CYCLONE_DATABASE_URL=postgresql+psycopg://... python examples/recovery.py``.

cyclone never starts a recovery on its own. Here the application:

1. runs a ``charge`` workflow whose ``capture`` step fails after ``authorize`` placed a
   hold on the customer's card, so the run ends ``failed`` with the hold still in place;
2. runs a *recovery pass*: it lists the failed ``charge`` runs with ``Client.list_runs``,
   sets each one's retention so the sweeper keeps it while it is being recovered, and
   submits an ``undo_charge`` run with ``submit_once`` under the key
   ``recover:<failed run id>``. Two passes that find the same failed run (here: two
   threads at once; in production: two processes or hosts) get the same recovery run;
3. drains a worker, which runs the recovery, and prints the outcome.
"""

from __future__ import annotations

import os
import threading
import uuid
from datetime import timedelta

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert

import cyclone

URL = os.environ.get(
    "CYCLONE_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
KEEP_WHILE_RECOVERING = timedelta(days=30)


class Payment(msgspec.Struct):
    order_id: str
    cents: int


engine = sa.create_engine(URL)
client = cyclone.Client(engine)

# The application's own table: card holds, keyed by the run that placed them.
holds = sa.Table(
    "example_holds",
    sa.MetaData(),
    sa.Column("run_id", sa.Uuid, primary_key=True),
    sa.Column("order_id", sa.Text, nullable=False),
    sa.Column("cents", sa.Integer, nullable=False),
    sa.Column("released", sa.Boolean, nullable=False, server_default=sa.false()),
)

charge: cyclone.Workflow[Payment] = cyclone.Workflow("example.charge", input=Payment)


@charge.step()
def authorize(ctx: cyclone.StepContext, payment: Payment) -> str:
    """Place a hold on the card (idempotent: one hold per run, whatever the attempt)."""
    with engine.begin() as conn:
        conn.execute(
            insert(holds)
            .values(run_id=ctx.run_id, order_id=payment.order_id, cents=payment.cents)
            .on_conflict_do_nothing()
        )
    return f"hold:{ctx.run_id}"


@charge.step(after=[authorize], max_attempts=1)
def capture(ctx: cyclone.StepContext, payment: Payment) -> None:
    raise RuntimeError(f"card declined while capturing {payment.cents} cents")


undo_charge: cyclone.ResultWorkflow[str, str] = cyclone.ResultWorkflow(
    "example.undo_charge", input=str, output=str
)


@undo_charge.result()
def release(ctx: cyclone.StepContext, failed_run_id: str) -> str:
    """Release the hold the failed run placed (idempotent: releasing twice is a no-op)."""
    with engine.begin() as conn:
        released = conn.execute(
            sa.update(holds)
            .where(holds.c.run_id == uuid.UUID(failed_run_id))
            .values(released=True)
            .returning(holds.c.cents)
        ).scalar()
    if released is None:
        return f"run {failed_run_id} placed no hold: nothing to release"
    return f"released the hold of {released} cents placed by run {failed_run_id}"


def recovery_key(failed_run_id: uuid.UUID) -> str:
    return f"recover:{failed_run_id}"


def recovery_pass() -> dict[uuid.UUID, tuple[cyclone.ResultRun[str], bool]]:
    """Start (or find) the one recovery run of every failed charge run."""
    started: dict[uuid.UUID, tuple[cyclone.ResultRun[str], bool]] = {}
    for failed in client.iter_runs(workflow=charge.name, state=cyclone.RunState.FAILED):
        # Keep the failed run until its recovery is done: without this, the retention
        # sweeper could purge it (and free its key) while the recovery still needs it.
        cyclone.Run(engine, failed.id, failed.workflow).set_retention(KEEP_WHILE_RECOVERING)
        # The key comes from the failed run's id, so every pass that finds this failed
        # run, in any thread, process or host, gets the same recovery run.
        started[failed.id] = undo_charge.submit_once(
            engine, recovery_key(failed.id), str(failed.id)
        )
    return started


def retry_unless_recovering(run: cyclone.Run) -> bool:
    """Retry a failed charge only if no recovery was started for it.

    cyclone does NOT block ``retry()`` / ``retry_all()`` on a run under recovery: that is
    the application's job. Retrying a run whose effects are being undone would charge the
    customer while the recovery releases the hold. This check-then-act is enough for a
    single operator; with concurrent callers, serialise it (for example with a row lock on
    the order in the application's own table) so a recovery cannot start in between.
    """
    if client.list_runs(workflow=undo_charge.name, key=recovery_key(run.id), limit=1):
        return False
    run.retry()
    return True


def main() -> None:
    cyclone.upgrade(engine)
    holds.create(engine, checkfirst=True)

    payment = Payment(order_id=uuid.uuid4().hex[:8], cents=1250)
    failing, _ = charge.submit_once(engine, f"order:{payment.order_id}", payment)
    cyclone.Worker(engine, workflows=[charge]).drain()
    status = failing.wait(timeout=30)
    print(f"charge run {failing.id}: {status.state.value} in step {status.failed_step!r}")
    if status.state != cyclone.RunState.FAILED:
        raise SystemExit("the charge run was expected to fail")

    # Two recovery passes at once find the same failed run and get the same recovery run.
    gate = threading.Barrier(2)
    passes: list[dict[uuid.UUID, tuple[cyclone.ResultRun[str], bool]]] = [{}, {}]

    def run_pass(i: int) -> None:
        gate.wait(timeout=30)
        passes[i] = recovery_pass()

    threads = [threading.Thread(target=run_pass, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    (first, created_first), (second, created_second) = (p[failing.id] for p in passes)
    print(f"pass 1: recovery run {first.id} (created={created_first})")
    print(f"pass 2: recovery run {second.id} (created={created_second})")
    if first.id != second.id or created_first == created_second:
        raise SystemExit("the two passes did not share one recovery run")

    if retry_unless_recovering(failing):
        raise SystemExit("a run under recovery was retried")
    print(f"retry of {failing.id} refused: a recovery run exists for it")

    cyclone.Worker(engine, workflows=[charge, undo_charge]).drain()
    outcome = first.result(timeout=30)
    kept = client.get_run(failing.id)
    with engine.connect() as conn:
        released = conn.execute(
            sa.select(holds.c.released).where(holds.c.run_id == failing.id)
        ).scalar_one()
    print(f"recovery: {outcome}")
    print(f"failed run kept for {kept.retention if kept else None}; hold released: {released}")
    if not released or kept is None or kept.retention != KEEP_WHILE_RECOVERING:
        raise SystemExit("the recovery did not complete as expected")


if __name__ == "__main__":
    main()
