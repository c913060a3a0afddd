"""The duplicate fast path of ``submit_once`` reads a run's ``xmax`` to know that no purge
of it is in flight: a row share-locked by several transactions carries a multixact there.

Two ``FOR KEY SHARE`` holders (a multixact ``xmax``, neither 0 nor the row's ``xmin``) and
a ``DELETE`` waiting behind them: the duplicate still returns the existing run, makes no
second one and does not wait for the delete; once the delete commits the key is free.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

import cyclone
from tests.conftest import wait_until
from tests.support.workers import Background


def test_a_duplicate_of_a_run_with_two_key_share_lockers_and_a_waiting_delete(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[dict[str, int]] = cyclone.Workflow(name, input=dict[str, int])

    @wf.step()
    def only(ctx: cyclone.StepContext, value: dict[str, int]) -> None:
        return None

    run, created = wf.submit_once(engine, "k", {"n": 1})
    assert created
    lockers = [engine.connect() for _ in range(2)]
    deleted = threading.Event()

    def delete() -> Any:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM cyclone_runs WHERE id = :id"), {"id": run.id})
            deleted.set()

    try:
        for conn in lockers:
            conn.execute(
                sa.text("SELECT 1 FROM cyclone_runs WHERE id = :id FOR KEY SHARE"), {"id": run.id}
            )
        with engine.connect() as probe:
            xmin, xmax = probe.execute(
                sa.text("SELECT xmin::text, xmax::text FROM cyclone_runs WHERE id = :id"),
                {"id": run.id},
            ).one()
            members = probe.execute(
                sa.text("SELECT mode FROM pg_get_multixact_members(CAST(:x AS xid))"), {"x": xmax}
            ).scalars()
            assert sorted(members) == ["keysh", "keysh"]
        assert xmax not in ("0", xmin)
        purge = Background(delete, name="purge")
        wait_until(lambda: waiting_deletes(engine) == 1)

        # The duplicate answers at once, with the existing run, while the delete waits.
        duplicate = Background(lambda: wf.submit_once(engine, "k", {"n": 1}), name="duplicate")
        assert duplicate.join(10) == (run, False)
        assert not deleted.is_set()
        for conn in lockers:
            conn.rollback()
        purge.join(30)
    finally:
        for conn in lockers:
            conn.close()
    again, created = wf.submit_once(engine, "k", {"n": 1})
    assert created
    assert again.id != run.id


def waiting_deletes(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE 'DELETE FROM cyclone_runs%' AND datname = current_database()"
                )
            ).scalar_one()
        )
