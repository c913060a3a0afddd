"""Flow control with several worker processes: Concurrency per key, fairness, rescue, Rate.

The workers are processes of their own (tests/support/flow_proc.py); the number running
per key is sampled from the database while they run.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone.schema import jobs
from tests.conftest import wait_until
from tests.support import processes
from tests.support.factories import starts_per_second
from tests.support.flow_proc import kinds, step_workflows
from tests.support.workers import REPO, job_rows

pytestmark = pytest.mark.processes


def spawn(name: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    """A worker process of ``spec``. Its stderr is the test's own (captured by pytest and
    shown when the test fails): a pipe nobody reads until the end would block a worker
    that logs more than the pipe holds."""
    env = dict(os.environ)
    assert "CYCLONE_TEST_DATABASE_URL" in env, "the database_url fixture sets it"
    proc = processes.popen(
        [sys.executable, "-m", "tests.support.flow_proc", name, json.dumps(spec)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc


def stop(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)


def running_per_key(engine: sa.Engine, prefix: str) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT limit_key, count(*) FROM cyclone_jobs "
                "WHERE state = 'running' AND kind LIKE :p GROUP BY limit_key"
            ),
            {"p": prefix + "%"},
        ).all()
    return Counter({key: n for key, n in rows})


def left(engine: sa.Engine, prefix: str) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM cyclone_jobs WHERE kind LIKE :p AND state <> 'completed'"
                ),
                {"p": prefix + "%"},
            ).scalar_one()
        )


def sample_until_done(engine: sa.Engine, prefix: str, timeout: float = 60.0) -> Counter[str]:
    """The most seen running at once per key, sampled until every job completed."""
    most: Counter[str] = Counter()
    deadline = time.monotonic() + timeout
    while left(engine, prefix):
        for key, n in running_per_key(engine, prefix).items():
            most[key] = max(most[key], n)
        assert time.monotonic() < deadline, f"jobs left: {left(engine, prefix)}"
    return most


def enqueue_many(engine: sa.Engine, step: Any, items: list[dict[str, Any]]) -> None:
    for args in items:
        step.enqueue(engine, args)


def test_the_jobs_running_per_key_never_exceed_max_across_worker_processes(
    engine: sa.Engine, name: str
) -> None:
    spec = {"limit": "concurrency", "max": 2, "concurrency": 4}
    (step,) = kinds(name, spec)
    enqueue_many(engine, step, [{"k": k, "ms": 20} for k in "abc" for _ in range(15)])
    procs = [spawn(name, spec) for _ in range(3)]
    try:
        most = sample_until_done(engine, name)
    finally:
        stop(procs)
    assert set(most) <= {"a", "b", "c"}
    assert max(most.values()) == 2, most


def test_a_killed_workers_slot_comes_back_when_its_job_is_rescued(
    engine: sa.Engine, name: str, tmp_path: Path
) -> None:
    spec = {"limit": "concurrency", "max": 1, "concurrency": 4}
    (step,) = kinds(name, spec)
    flag = tmp_path / "blocked"
    step.enqueue(engine, {"k": "x", "ms": 0, "block": str(flag)})
    first = spawn(name, spec)
    wait_until(flag.exists, timeout=30)
    enqueue_many(engine, step, [{"k": "x", "ms": 10} for _ in range(5)])
    other = spawn(name, spec)
    try:
        # While the killed worker's job holds the only slot, nothing else of "x" starts.
        first.kill()
        first.communicate(timeout=10)
        most = sample_until_done(engine, name)
    finally:
        stop([first, other])
    assert most["x"] == 1
    with engine.connect() as conn:
        lost = conn.execute(
            sa.text("SELECT lost FROM cyclone_jobs WHERE kind = :k AND args ? 'block'"),
            {"k": name},
        ).scalar_one()
    assert lost == 1


@pytest.mark.parametrize("limit", ["concurrency", "shared"])
def test_a_key_with_few_jobs_is_served_before_a_key_with_many_has_run_twenty(
    engine: sa.Engine, name: str, limit: str
) -> None:
    spec = {"limit": limit, "max": 1 if limit == "concurrency" else 2, "concurrency": 2}
    steps = kinds(name, spec)
    big, small = steps[0], steps[-1]
    with engine.begin() as conn:
        for _ in range(1000):
            big.enqueue_tx(conn, {"k": "big", "ms": 5})
        for _ in range(10):
            small.enqueue_tx(conn, {"k": "small", "ms": 5})
    procs = [spawn(name, spec) for _ in range(2)]
    try:

        def small_done() -> bool:
            with engine.connect() as conn:
                return not conn.execute(
                    sa.text(
                        "SELECT count(*) FROM cyclone_jobs WHERE kind LIKE :p "
                        "AND limit_key = 'small' AND state <> 'completed'"
                    ),
                    {"p": name + "%"},
                ).scalar_one()

        wait_until(small_done, timeout=60)
    finally:
        stop(procs)
    with engine.connect() as conn:
        starts = (
            conn.execute(
                sa.text(
                    "SELECT limit_key FROM cyclone_jobs WHERE kind LIKE :p "
                    "AND attempted_at IS NOT NULL ORDER BY attempted_at, id"
                ),
                {"p": name + "%"},
            )
            .scalars()
            .all()
        )
    big_starts = [i for i, key in enumerate(starts) if key == "big"]
    last_small = max(i for i, key in enumerate(starts) if key == "small")
    assert len(big_starts) < 20 or last_small < big_starts[19], starts[:40]
    with engine.begin() as conn:
        conn.execute(
            sa.text("DELETE FROM cyclone_jobs WHERE kind LIKE :p AND state <> 'running'"),
            {"p": name + "%"},
        )


def test_a_rate_starts_at_most_limit_attempts_per_window(engine: sa.Engine, name: str) -> None:
    spec = {"limit": "rate", "max": 3, "per": 1, "concurrency": 4}
    (step,) = kinds(name, spec)
    enqueue_many(engine, step, [{"k": "r", "ms": 0} for _ in range(10)])
    procs = [spawn(name, spec) for _ in range(2)]
    try:
        sample_until_done(engine, name, timeout=30)
    finally:
        stop(procs)
    windows = starts_per_second(engine, jobs.c.kind == name)
    assert all(n <= 3 for _, n in windows), windows
    assert len(windows) >= 4, windows


def test_a_limit_set_at_run_time_takes_effect(engine: sa.Engine, name: str) -> None:
    spec = {"limit": "concurrency", "max": 1, "concurrency": 8}
    (step,) = kinds(name, spec)
    enqueue_many(engine, step, [{"k": "x", "ms": 300} for _ in range(12)])
    procs = [spawn(name, spec)]
    client = cyclone.Client(engine)
    try:
        wait_until(lambda: running_per_key(engine, name)["x"] == 1, timeout=30)
        client.set_limit(f"kind:{name}", 3)
        wait_until(lambda: running_per_key(engine, name)["x"] == 3, timeout=5)
        (status,) = [s for s in client.list_limits() if s.name == f"kind:{name}"]
        assert status.max == 3
        assert status.set_by_operator
        most = sample_until_done(engine, name)
    finally:
        stop(procs)
    assert most["x"] == 3


def test_a_concurrency_refuses_bad_values_at_definition() -> None:
    with pytest.raises(cyclone.DefinitionError, match="max"):
        cyclone.Concurrency(0)
    with pytest.raises(cyclone.DefinitionError, match="on_limit"):
        cyclone.Concurrency(1, on_limit="drop")  # type: ignore[arg-type]
    with pytest.raises(cyclone.DefinitionError, match="per"):
        cyclone.Rate(1, timedelta())
    # The limits' columns are PostgreSQL integers: a larger value failed at the first
    # enqueue with the driver's DataError.
    with pytest.raises(cyclone.DefinitionError, match="max must be an int from 1"):
        cyclone.Concurrency(2**31)
    with pytest.raises(cyclone.DefinitionError, match="limit must be an int from 1"):
        cyclone.Rate(2**31, timedelta(seconds=1))
    # The end of a window is read as its start plus per: past 1,000 years it fell after
    # year 9999, and a worker serving the Rate failed that read at every idle loop.
    with pytest.raises(cyclone.DefinitionError, match="per is at most 365250 days"):
        cyclone.Rate(1, timedelta(days=365_251))
    with pytest.raises(cyclone.DefinitionError, match="per is at most"):
        cyclone.Rate(1, timedelta.max)
    assert cyclone.Rate(1, timedelta(days=365_250)).per == timedelta(days=365_250)
    assert cyclone.Concurrency(2**31 - 1).max == 2**31 - 1


@pytest.mark.parametrize(
    ("bad", "error"),
    [("a\x00b", ValueError), ("\udcff", ValueError), (5, TypeError), (None, TypeError)],
)
def test_set_limit_refuses_a_name_text_cannot_hold_before_a_statement(
    engine: sa.Engine, bad: Any, error: type[Exception]
) -> None:
    # A NUL failed in the driver ("cannot contain NUL (0x00) bytes"), a lone surrogate in
    # its encoder (UnicodeEncodeError); an int or None said no limit is named 5.
    with pytest.raises(error, match="name"):
        cyclone.Client(engine).set_limit(bad, 3)


def test_limits_set_of_a_name_that_is_no_utf8_is_bad_usage_naming_name(
    database_url: URL,
) -> None:
    from click.testing import CliRunner

    from cyclone.cli import build_cli

    url = database_url.render_as_string(False)
    done = CliRunner().invoke(build_cli(), ["limits", "set", "x\udcff", "3", "--url", url])
    # It blamed MAX: "cyclone: MAX: 'utf-8' codec can't encode character ...".
    assert done.exit_code == 2
    assert done.stderr == (
        "cyclone: NAME: name='x\\udcff' is not valid UTF-8 (it holds a lone surrogate)\n"
    )


def test_limits_list_and_set_on_the_command_line(engine: sa.Engine, name: str) -> None:
    from click.testing import CliRunner

    from cyclone.cli import build_cli

    (step,) = kinds(name, {"limit": "concurrency", "max": 2})
    step.enqueue(engine, {"k": "a", "ms": 0})
    url = engine.url.render_as_string(False)
    listed = CliRunner().invoke(build_cli(), ["limits", "list", "--url", url])
    assert listed.exit_code == 0, listed.output
    assert f"kind:{name}: max 2 attempts" in listed.stdout
    assert "  a: 0 running, 1 waiting" in listed.stdout
    changed = CliRunner().invoke(build_cli(), ["limits", "set", f"kind:{name}", "5", "--url", url])
    assert changed.exit_code == 0, changed.output
    (status,) = [s for s in cyclone.Client(engine).list_limits() if s.name == f"kind:{name}"]
    assert (status.max, status.set_by_operator, status.keys) == (5, True, {"a": (0, 1)})
    unknown = CliRunner().invoke(build_cli(), ["limits", "set", "nope", "1", "--url", url])
    assert unknown.exit_code == 1
    assert len(unknown.stderr.strip().splitlines()) == 1
    # Past the integer column: bad usage, said in one line, not "database error".
    huge = CliRunner().invoke(
        build_cli(), ["limits", "set", f"kind:{name}", str(2**31), "--url", url]
    )
    assert huge.exit_code == 2, huge.output
    assert huge.stderr.startswith("cyclone: MAX: a limit's max is an int from 0 to 2147483647")
    assert len(huge.stderr.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="from 0 to 2147483647"):
        cyclone.Client(engine).set_limit(f"kind:{name}", 2**31)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM cyclone_jobs WHERE kind = :k"), {"k": name})


def test_a_worker_serving_only_limited_kinds_records_and_claims_in_one_statement(
    engine: sa.Engine, name: str, statements: Any
) -> None:
    (step,) = kinds(name, {"limit": "concurrency", "max": 100})
    with engine.begin() as conn:
        for _ in range(40):
            step.enqueue_tx(conn, {"k": "a", "ms": 0})
    with cyclone.Worker(engine, steps=[step], concurrency=1, sweep=False) as worker:
        statements.reset()
        worker.drain()
    # One job at a time: each statement records the last job and claims the next. No
    # statement claims nothing but limited jobs apart, and none only rings NOTIFY.
    assert not [s for s in statements.statements if s.lstrip().startswith("SELECT pg_notify")]
    claims = [s for s in statements.statements if "FROM cyclone_limit_keys" in s]
    assert len(claims) <= 40 + 2, len(claims)
    # The rest is the worker's start and its looks for earlier limits, then the leader's
    # maintenance rounds (its lease, the deadline sweep, the rescue, the prune of silent
    # workers), the worker's row in cyclone_workers (written, beaten, deleted), each new
    # connection's set-up and the looks at the tables' sizes for replanning: as many as
    # the drain lasts and the connections it opens, so left out. A statement per job
    # besides its claim would add 40.
    maintenance = (
        "cyclone_leader",
        "WITH expired",
        "cyclone_jobs.state = 'running'",
        "cyclone_workers",
    )
    per_connection = (
        "pg_catalog.version()",
        "current_schema()",
        "show transaction isolation level",
        "show standard_conforming_strings",
        "plan_cache_mode",
        "LISTEN",
        "pg_relation_size",
    )
    others = [
        s
        for s in statements.statements
        if "FROM cyclone_limit_keys" not in s
        and not any(m in s for m in maintenance + per_connection)
    ]
    assert len(others) <= 20, others


def test_a_worker_serving_one_kind_of_a_shared_limit_never_claims_another_kinds_job(
    engine: sa.Engine, name: str
) -> None:
    # The limited claim chose jobs by limit name alone: a worker serving kind a claimed
    # kind b's job, sharing a's limit, and failed it as a kind it does not define.
    a, b = kinds(name, {"limit": "shared", "max": 2})
    ours = a.enqueue(engine, {"k": "x", "ms": 0})
    theirs = b.enqueue(engine, {"k": "x", "ms": 0})
    with cyclone.Worker(engine, steps=[a], sweep=False) as worker:
        assert worker.drain() == 1
    assert ours.status().state == "completed"
    assert (theirs.status().state, theirs.status().attempt) == ("available", 0)
    with cyclone.Worker(engine, steps=[b], sweep=False) as worker:
        assert worker.drain() == 1
    assert theirs.status().state == "completed"


def test_jobs_enqueued_before_a_redeploy_renamed_their_limit_run_under_the_one_they_kept(
    engine: sa.Engine, name: str
) -> None:
    # A job keeps its limit's name; the kind's new definition names another, which the
    # ordinary claim leaves to the limited claim, which served only the new name.
    before = cyclone.step(name, concurrency=cyclone.Concurrency(1, name=f"{name}-old"))(
        lambda ctx, args: None
    )
    jobs = [before.enqueue(engine, {"n": n}) for n in range(3)]
    after = cyclone.step(name, concurrency=cyclone.Concurrency(1, name=f"{name}-new"))(
        lambda ctx, args: None
    )
    with cyclone.Worker(engine, steps=[after], sweep=False) as worker:
        assert worker.drain() == 3
    assert {job.status().state for job in jobs} == {"completed"}


def test_jobs_enqueued_before_a_redeploy_dropped_their_kinds_limit_keep_it(
    engine: sa.Engine, name: str
) -> None:
    # The kind's new definition has no limit: its ordinary claim took the earlier jobs
    # too, three at once under a limit of one.
    def slow(ctx: cyclone.StepContext, args: dict[str, int]) -> None:
        time.sleep(0.05)  # the step's work, long enough for attempts to overlap

    before = cyclone.step(name, concurrency=cyclone.Concurrency(1, name=f"{name}-old"))(slow)
    earlier = [before.enqueue(engine, {"n": n}) for n in range(3)]
    after = cyclone.step(name)(slow)
    later = [after.enqueue(engine, {"n": n}) for n in range(3, 6)]
    with cyclone.Worker(engine, steps=[after], concurrency=6, sweep=False) as worker:
        assert worker.drain() == 6
    assert {job.status().state for job in earlier + later} == {"completed"}
    with engine.connect() as conn:
        spans = conn.execute(
            sa.text(
                "SELECT attempted_at, finalized_at FROM cyclone_jobs "
                "WHERE kind = :k AND limit_name IS NOT NULL ORDER BY attempted_at"
            ),
            {"k": name},
        ).all()
    assert len(spans) == 3
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans)), spans


def test_jobs_enqueued_before_a_redeploy_gave_their_kind_a_limit_still_run(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # They have no limit; the kind's new definition has one, so the ordinary claim left
    # the whole kind to the limited claim, which reads only limited jobs: they waited forever.
    before = cyclone.step(name)(lambda ctx, args: None)
    earlier = [before.enqueue(engine, {"n": n}) for n in range(3)]
    after = cyclone.step(name, concurrency=cyclone.Concurrency(1))(lambda ctx, args: None)
    later = after.enqueue(engine, {"n": 3})
    with cyclone.Worker(engine, steps=[after], sweep=False) as worker:
        assert worker.drain() == 4
    assert {job.status().state for job in [*earlier, later]} == {"completed"}
    # A serving worker takes them on too, after its first claim.
    more = [before.enqueue(engine, {"n": n}) for n in range(4, 6)]
    serving(cyclone.Worker(engine, steps=[after], poll_interval=600, sweep=False))
    for job in more:
        assert job.wait(timeout=30).state.value == "completed"


def test_a_paused_queues_limited_jobs_are_not_claimed_until_it_resumes(
    engine: sa.Engine, name: str
) -> None:
    step = cyclone.step(name, queue=name, concurrency=cyclone.Concurrency(2))(
        lambda ctx, args: None
    )
    jobs = [step.enqueue(engine, {"n": n}) for n in range(3)]
    client = cyclone.Client(engine)
    client.pause_queue(name)
    with cyclone.Worker(engine, steps=[step], sweep=False) as worker:
        worker.drain()
        assert {job.status().state for job in jobs} == {"available"}
        client.resume_queue(name)
        worker.drain()
    assert {job.status().state for job in jobs} == {"completed"}


def test_a_concurrency_and_a_rate_together_both_hold_and_a_shared_rate_counts_every_start(
    engine: sa.Engine, name: str
) -> None:
    spec = {"limit": "paired", "max": 2, "rate": 4, "per": 1, "concurrency": 4}
    paired, alone = kinds(name, spec)
    with engine.begin() as conn:
        for i in range(10):
            paired.enqueue_tx(conn, {"k": "ab"[i % 2], "ms": 300})
            alone.enqueue_tx(conn, {"k": "c", "ms": 0})
    procs = [spawn(name, spec) for _ in range(2)]
    try:
        most = sample_until_done(engine, name, timeout=60)
    finally:
        stop(procs)
    windows = starts_per_second(engine, jobs.c.kind.startswith(name))
    with engine.connect() as conn:
        rate_keys = conn.execute(
            sa.text("SELECT DISTINCT rate_name, rate_key FROM cyclone_jobs WHERE kind = :k"),
            {"k": f"{name}.paired"},
        ).all()
    assert rate_keys == [(f"{name}-rate", "")]
    assert all(n <= 4 for _, n in windows), windows
    assert len(windows) >= 5, windows
    assert max(most["a"], most["b"]) <= 2, most


def test_a_worker_waiting_on_a_full_rate_window_wakes_when_it_opens_not_at_its_poll(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    rate = cyclone.Rate(2, timedelta(seconds=1), name=f"{name}-rate")  # given with a Concurrency
    paired = cyclone.step(name, concurrency=cyclone.Concurrency(5), rate=rate)(
        lambda ctx, args: None
    )
    jobs = [paired.enqueue(engine, {"n": n}) for n in range(6)]
    serving(cyclone.Worker(engine, steps=[paired], concurrency=4, poll_interval=600))
    for job in jobs:
        wait_until(lambda job=job: job.status().state == "completed", timeout=30)


@pytest.mark.parametrize("limits", ["rate", "rate and concurrency"])
def test_a_worker_whose_claim_left_room_under_a_full_window_starts_more_when_it_opens(
    engine: sa.Engine, name: str, serving: Any, limits: str
) -> None:
    # Found by a review: a worker serving limited jobs read when the next one falls due
    # only after a claim that took nothing. Its claim took the window's one job and left
    # room; that job ran on and recorded nothing, so it slept until its poll.
    rate = cyclone.Rate(1, timedelta(seconds=1), name=f"{name}-rate")
    concurrency = cyclone.Concurrency(5) if limits == "rate and concurrency" else None
    started: list[int] = []
    release = threading.Event()

    @cyclone.step(name, concurrency=concurrency, rate=rate)
    def slow(ctx: cyclone.StepContext, args: dict[str, int]) -> None:
        started.append(args["n"])
        release.wait(30)

    waiting = [slow.enqueue(engine, {"n": n}) for n in range(3)]
    try:
        serving(cyclone.Worker(engine, steps=[slow], concurrency=3, poll_interval=600))
        wait_until(lambda: len(started) == 3, timeout=20)
    finally:
        release.set()
    for job in waiting:
        wait_until(lambda job=job: job.status().state == "completed", timeout=30)
    windows = starts_per_second(engine, jobs.c.kind == name)
    assert all(n <= 1 for _, n in windows), windows


def test_a_limited_step_handed_back_into_its_cancelled_run_wakes_the_worker_waiting_for_its_slot(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # Found by a review: a running limited step released straight to cancelled (its run
    # ended) freed its slot and rang no one; the worker waiting for that slot slept on
    # until its poll. The rescue of a stopped worker's job releases through the same
    # statement.
    entered, release = threading.Event(), threading.Event()
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step(concurrency=cyclone.Concurrency(1))
    def one(ctx: cyclone.StepContext, n: int) -> int:
        entered.set()
        release.wait(30)
        return n

    first = wf.submit(engine, 1)
    holding = cyclone.Worker(engine, workflows=[wf], concurrency=1, poll_interval=600)
    background = serving(holding)
    try:
        assert entered.wait(30)
        second = wf.submit(engine, 2)
        waiting = cyclone.Worker(engine, workflows=[wf], concurrency=1, poll_interval=600)
        serving(waiting)
        wait_until(lambda: asleep(engine, waiting), timeout=30)
        first.cancel()
        holding.stop(grace=0)  # hands its step back: cancelled, in the cancelled run
        background.join(30)
    finally:
        release.set()
    assert second.wait(timeout=20).state == cyclone.RunState.COMPLETED
    with engine.connect() as conn:
        state = conn.execute(
            sa.select(jobs.c.state).where(jobs.c.run_id == first.id, jobs.c.kind == "one")
        ).scalar_one()
    assert state == "cancelled"


def a_worker_waits_for_the_slot_of_a_killed_worker(
    engine: sa.Engine,
    name: str,
    spec: dict[str, Any],
    wf: cyclone.Workflow[Any],
    serving: Any,
    tmp_path: Path,
    then: Callable[[Any, Any], None],
) -> tuple[Any, Any]:
    """Run ``wf``'s first run of key ``x`` in a worker process of ``spec`` (flow_proc)
    until its first step blocks, holding the key's one slot; submit a second run of ``x``
    and serve ``wf`` in this process with a worker that polls every 600 s. Once that
    worker sleeps, call ``then(first, second)``, wait until it sleeps again and kill the
    process (SIGKILL): the maintenance leader rescues its step after the process's
    ``rescue_after`` (1 s). Returns the two runs; only a ring wakes the sleeping worker."""
    flag = tmp_path / "blocked"
    first = wf.submit(engine, {"k": "x", "ms": 0, "block": str(flag)})
    holder = spawn(name, spec)
    try:
        wait_until(flag.exists, timeout=30)
        second = wf.submit(engine, {"k": "x", "ms": 0})
        waiting = cyclone.Worker(engine, workflows=[wf], concurrency=1, poll_interval=600)
        serving(waiting)
        wait_until(lambda: asleep(engine, waiting), timeout=30)
        then(first, second)
        wait_until(lambda: asleep(engine, waiting), timeout=30)
        holder.kill()
        holder.communicate(timeout=10)
    finally:
        stop([holder])
    return first, second


def lost_twice_before(engine: sa.Engine, run_id: Any, step: str) -> None:
    """Mark ``step``'s job of ``run_id`` as lost with its worker twice already: its next
    loss is its last (``max(max_attempts, 3)``), and the rescue gives it up."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(jobs).where(jobs.c.run_id == run_id, jobs.c.kind == step).values(lost=2)
        )


@pytest.mark.parametrize("ends", ["cancelled", "given up"])
def test_a_limited_step_rescued_and_ended_wakes_the_worker_waiting_for_its_slot(
    engine: sa.Engine, name: str, tmp_path: Path, serving: Any, ends: str
) -> None:
    # The rescue of a killed worker's running limited step that ends it (its run was
    # cancelled, or it was lost with its worker too many times) frees its slot, and its
    # statement rings, as the hand-back's does (the test above): the worker waiting for
    # the slot slept on until its poll before.
    spec = {"limit": "steps", "max": 1, "concurrency": 1}
    (wf,) = step_workflows(name, spec)

    def end(first: Any, second: Any) -> None:
        assert job_rows(engine, second.id)["limited"].state == "available"  # for the slot
        if ends == "cancelled":
            first.cancel()
            return
        lost_twice_before(engine, first.id, "limited")

    first, second = a_worker_waits_for_the_slot_of_a_killed_worker(
        engine, name, spec, wf, serving, tmp_path, end
    )
    # Well within the waiting worker's 600 s poll: a rescue under load takes a while.
    assert second.wait(timeout=90).state == cyclone.RunState.COMPLETED
    row = job_rows(engine, first.id)["limited"]
    assert row.state == ("cancelled" if ends == "cancelled" else "failed")
    assert [e["type"] for e in row.errors] == ["WorkerLost"]
    assert first.status().state == ("cancelled" if ends == "cancelled" else "failed")


def test_a_rate_key_another_transaction_held_at_the_claim_is_claimed_again_shortly_not_at_its_poll(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # Another worker's claim holds the Rate's key: the claim skips it, its window has room,
    # nothing rings when that transaction ends and nothing falls due. The worker counted
    # only the Concurrency's keys as contended, so it slept until its poll.
    rate = cyclone.Rate(100, timedelta(seconds=60), name=f"{name}-rate")
    paired = cyclone.step(name, concurrency=cyclone.Concurrency(5), rate=rate)(
        lambda ctx, args: None
    )
    waiting = [paired.enqueue(engine, {"n": n}) for n in range(3)]
    worker = cyclone.Worker(engine, steps=[paired], concurrency=4, poll_interval=600)
    with engine.connect() as holder:
        holder.execute(
            sa.text("SELECT 1 FROM cyclone_limit_keys WHERE name = :n FOR UPDATE"),
            {"n": f"{name}-rate"},
        )
        serving(worker)
        # Held until the worker either looks again for the key it could not take, or
        # sleeps (until its poll) having seen no contention.
        wait_until(lambda: worker._contention_looks >= 3 or asleep(engine, worker), timeout=30)
        assert all(job.status().state == "available" for job in waiting)
        holder.commit()
    for job in waiting:
        wait_until(lambda job=job: job.status().state == "completed", timeout=30)


def test_a_worker_that_took_on_an_earlier_limit_with_a_rate_wakes_when_its_window_opens(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # The jobs keep the Concurrency and the Rate they were enqueued under; the worker took
    # both on, but read when a limited job may start without the Rate's window: it slept
    # until its poll.
    rate = cyclone.Rate(2, timedelta(seconds=1), name=f"{name}-old-rate")
    before = cyclone.step(name, concurrency=cyclone.Concurrency(5, name=f"{name}-old"), rate=rate)(
        lambda ctx, args: None
    )
    waiting = [before.enqueue(engine, {"n": n}) for n in range(6)]
    after = cyclone.step(name, concurrency=cyclone.Concurrency(5, name=f"{name}-new"))(
        lambda ctx, args: None
    )
    serving(cyclone.Worker(engine, steps=[after], concurrency=4, poll_interval=600))
    for job in waiting:
        wait_until(lambda job=job: job.status().state == "completed", timeout=30)
    windows = starts_per_second(engine, jobs.c.kind == name)
    assert all(n <= 2 for _, n in windows), windows  # the Rate it took on still holds


def test_list_limits_counts_a_shared_rates_jobs_alone_and_beside_a_concurrency_together(
    engine: sa.Engine, name: str
) -> None:
    paired, alone = kinds(name, {"limit": "paired", "max": 2, "rate": 4, "per": 1})
    paired.enqueue(engine, {"k": "a", "ms": 0})
    alone.enqueue(engine, {"k": "a", "ms": 0})
    alone.enqueue(engine, {"k": "a", "ms": 0})
    limits = {s.name: s for s in cyclone.Client(engine).list_limits()}
    assert dict(limits[f"{name}-rate"].keys) == {"": (0, 3)}
    assert dict(limits[f"kind:{name}.paired"].keys) == {"a": (0, 1)}
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM cyclone_jobs WHERE kind LIKE :p"), {"p": name + "%"})


def asleep(engine: sa.Engine, worker: cyclone.Worker) -> bool:
    """Whether ``worker`` is recorded as waiting for work and its own connection went idle
    after its last claim: it sleeps, and only a NOTIFY (or its poll) wakes it."""
    held = worker._held
    direct = None if held is None else held._direct
    if direct is None:
        return False
    pid = direct._driver.info.backend_pid
    with engine.connect() as conn:
        recorded = conn.execute(
            sa.text("SELECT 1 FROM cyclone_waiters WHERE worker_id = :me AND waits_until > now()"),
            {"me": worker.id},
        ).first()
        row = conn.execute(
            sa.text("SELECT state, query FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
        ).first()
    return (
        recorded is not None
        and row is not None
        and row[0] == "idle"
        and "cyclone_waiters" not in row[1]
        and "pg_try_advisory_lock" not in row[1]
    )


@pytest.mark.parametrize(
    ("limit", "end"), [("defined", "completed"), ("taken on", "completed"), ("defined", "failed")]
)
def test_a_limited_job_that_ends_wakes_the_worker_waiting_for_its_slot_in_another_queue(
    engine: sa.Engine, name: str, limit: str, end: str, serving: Any
) -> None:
    # The worker whose job ended had room again, but not for the waiting job (another
    # queue): it rang only when it had no room, or, for a limit it took on from an earlier
    # definition, never; the other worker slept until its poll.
    release = threading.Event()

    def hold(ctx: cyclone.StepContext, n: int) -> int:
        if n == 1:
            release.wait(60)
            if end == "failed":
                raise RuntimeError("the first job fails, freeing its slot")
        return n

    limited = cyclone.Concurrency(1, name=f"{name}-old")
    before = cyclone.step(name, concurrency=limited, max_attempts=1)(hold)
    first = before.enqueue(engine, 1, queue="one")
    second = before.enqueue(engine, 2, queue="two")
    kind = before
    if limit == "taken on":
        renamed = cyclone.Concurrency(1, name=f"{name}-new")
        kind = cyclone.step(name, concurrency=renamed, max_attempts=1)(hold)
    one, two = (
        cyclone.Worker(engine, steps=[kind], queues={queue: 1}, poll_interval=3600, sweep=False)
        for queue in ("one", "two")
    )
    try:
        serving(one)
        wait_until(lambda: first.status().state == "running", timeout=30)
        serving(two)
        wait_until(lambda: asleep(engine, two), timeout=30)
        assert second.status().state == "available"
        release.set()
        assert first.wait(timeout=30).state.value == end
        assert second.wait(timeout=30).state.value == "completed"
    finally:
        release.set()  # the serving fixture stops both workers


@pytest.mark.parametrize("serves", ["a limited and an unlimited kind", "a limited kind only"])
def test_a_worker_that_takes_a_freed_slot_again_rings_no_other_worker(
    engine: sa.Engine, name: str, serves: str
) -> None:
    # A worker serving a limited kind and an unlimited one records an end, then claims
    # the limited jobs in a statement of its own, which takes the freed slot again: it
    # rang at every end all the same, waking every idle worker; now only when a slot
    # stays free (the last job's end). A worker serving only limited kinds records and
    # claims in one statement, which cannot see the slot it frees: that statement rang,
    # at every end, and the worker waited for its own ring; it now claims again at once.
    step = cyclone.step(name, concurrency=cyclone.Concurrency(1))(lambda ctx, args: None)
    free = cyclone.step(f"{name}.free")(lambda ctx, args: None)
    served = [step, free] if serves.startswith("a limited and") else [step]
    for n in range(5):
        step.enqueue(engine, {"n": n})
    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as listening:
        # A worker recorded as waiting, so that each ring notifies.
        listening.execute("DELETE FROM cyclone_waiters")
        listening.execute("INSERT INTO cyclone_waiters VALUES ('elsewhere', now() + '1 minute')")
        listening.execute('LISTEN "cyclone_jobs_available"')
        try:
            with cyclone.Worker(engine, steps=served, sweep=False) as worker:
                assert worker.drain() == 5
            rings = sum(1 for _ in listening.notifies(timeout=0.5))
        finally:
            listening.execute("DELETE FROM cyclone_waiters")
    assert rings <= 1


def test_a_serving_worker_runs_a_limited_kinds_jobs_one_after_another_without_polling(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # Its statement that records an end cannot take the slot it frees (its claim sees the
    # job still running): it waited for its poll before the next job, one job a poll.
    step = cyclone.step(name, concurrency=cyclone.Concurrency(1))(lambda ctx, args: None)
    serving(cyclone.Worker(engine, steps=[step], poll_interval=600, sweep=False))
    jobs = [step.enqueue(engine, {"n": n}) for n in range(5)]
    for job in jobs:
        assert job.wait(timeout=30).state.value == "completed"


def test_two_workers_woken_by_one_ring_both_take_a_job_of_a_key_with_room(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # Found by a review: the limited claim locks a key's row SKIP LOCKED, and skips a key
    # claimed from since its snapshot. Of two workers woken by one NOTIFY, the one that
    # lost the race for the key claimed nothing and slept until its poll, though the key
    # had room and a job waited.
    release = threading.Event()

    def hold(ctx: cyclone.StepContext, n: int) -> int:
        release.wait(60)
        return n

    kind = cyclone.step(name, concurrency=cyclone.Concurrency(5))(hold)
    one, two = (
        cyclone.Worker(engine, steps=[kind], concurrency=1, poll_interval=3600, sweep=False)
        for _ in range(2)
    )
    try:
        serving(one)
        serving(two)
        for _ in range(3):
            wait_until(lambda: asleep(engine, one) and asleep(engine, two), timeout=30)
            with engine.begin() as conn:
                first = kind.enqueue_tx(conn, 1)
                second = kind.enqueue_tx(conn, 2)
            pair = (first, second)
            wait_until(
                lambda pair=pair: [job.status().state for job in pair] == ["running"] * 2,
                timeout=10,
                message=lambda pair=pair: str([job.status().state for job in pair]),
            )
            release.set()
            assert [job.wait(timeout=30).state.value for job in pair] == ["completed"] * 2
            release.clear()
    finally:
        release.set()


def test_a_slot_freed_under_one_limit_rings_though_the_worker_takes_a_slot_of_another(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # Found by a review. W1 (concurrency 1) serves a (limit A) and b (limit B); W2 serves
    # c (limit A too). a1 ends and W1's claim takes b1 (limit B): the worker counted one
    # slot freed and one taken, and rang no one, though A's slot was free and c1 waited
    # for it on W2 until its poll. Slots are now told by limit and key.
    release_a = threading.Event()
    release_b = threading.Event()

    def hold_a(ctx: cyclone.StepContext, n: int) -> int:
        release_a.wait(60)
        return n

    def hold_b(ctx: cyclone.StepContext, n: int) -> int:
        release_b.wait(60)
        return n

    a = cyclone.step(f"{name}.a", concurrency=cyclone.Concurrency(1, name=f"{name}-A"))(hold_a)
    b = cyclone.step(f"{name}.b", concurrency=cyclone.Concurrency(1, name=f"{name}-B"))(hold_b)
    c = cyclone.step(f"{name}.c", concurrency=cyclone.Concurrency(1, name=f"{name}-A"))(
        lambda ctx, n: n
    )
    w1 = cyclone.Worker(engine, steps=[a, b], concurrency=1, poll_interval=3600, sweep=False)
    w2 = cyclone.Worker(engine, steps=[c], poll_interval=3600, sweep=False)
    try:
        a1 = a.enqueue(engine, 1)
        serving(w1)
        wait_until(lambda: a1.status().state == "running", timeout=30)
        b1 = b.enqueue(engine, 1)  # W1 is full: it waits
        c1 = c.enqueue(engine, 1)  # limit A is full: it waits
        serving(w2)
        wait_until(lambda: asleep(engine, w2), timeout=30)
        assert c1.status().state == "available"
        release_a.set()
        assert a1.wait(timeout=30).state.value == "completed"
        wait_until(lambda: b1.status().state == "running", timeout=30)
        # A's slot is free now; c1 starts at once, while b1 still runs.

        def state() -> str:
            with engine.connect() as conn:
                running_a = conn.execute(
                    sa.select(sa.func.count()).where(
                        jobs.c.limit_name == f"{name}-A", jobs.c.state == "running"
                    )
                ).scalar()
            return (
                f"c1 is {c1.status().state}, {running_a} running under limit A, "
                f"W2 asleep: {asleep(engine, w2)}"
            )

        wait_until(lambda: c1.status().state == "completed", timeout=15, message=state)
    finally:
        release_a.set()
        release_b.set()


def test_a_slot_freed_by_a_failure_is_rung_for_after_the_next_statement_failed(
    engine: sa.Engine, name: str, serving: Any, monkeypatch: Any
) -> None:
    # Found by a review. W1's limited job fails: its failure is recorded (committed), then
    # a statement of the same round fails (a lost connection, injected into its ring).
    # The round tried again counted the slots of the outcomes it still had to record,
    # none: nothing rang for c1 on W2 until its poll.
    limits_store = sys.modules[cyclone.Worker.__module__]._limits_store
    release = threading.Event()

    def fail(ctx: cyclone.StepContext, n: int) -> int:
        release.wait(60)
        raise RuntimeError("a1 fails, freeing A's slot")

    a = cyclone.step(
        f"{name}.a", concurrency=cyclone.Concurrency(1, name=f"{name}-A"), max_attempts=1
    )(fail)
    c = cyclone.step(f"{name}.c", concurrency=cyclone.Concurrency(1, name=f"{name}-A"))(
        lambda ctx, n: n
    )
    w1 = cyclone.Worker(engine, steps=[a], concurrency=1, poll_interval=3600, sweep=False)
    w2 = cyclone.Worker(engine, steps=[c], poll_interval=3600, sweep=False)
    real = limits_store.ring
    armed = threading.Event()

    def flaky(conn: Any) -> None:
        if threading.current_thread() is w1_thread.thread and armed.is_set():
            armed.clear()
            raise sa.exc.OperationalError("ring", {}, psycopg.OperationalError("lost"))
        real(conn)

    monkeypatch.setattr(limits_store, "ring", flaky)
    try:
        a1 = a.enqueue(engine, 1)
        w1_thread = serving(w1)
        wait_until(lambda: a1.status().state == "running", timeout=30)
        c1 = c.enqueue(engine, 1)
        serving(w2)
        wait_until(lambda: asleep(engine, w2), timeout=30)
        assert c1.status().state == "available"
        armed.set()
        release.set()
        assert a1.wait(timeout=30).state.value == "failed"
        wait_until(lambda: not armed.is_set(), timeout=30)  # the injected failure happened
        wait_until(
            lambda: c1.status().state == "completed",
            timeout=15,
            message=lambda: f"c1 is {c1.status().state}, W2 asleep: {asleep(engine, w2)}",
        )
    finally:
        release.set()


def test_a_rate_that_a_deploy_dropped_beside_a_kept_concurrency_still_holds_its_jobs(
    engine: sa.Engine, name: str
) -> None:
    # Found by a review: jobs enqueued under a Concurrency and a Rate keep both; a deploy
    # that kept the Concurrency (its default name) and dropped the Rate left the Rate
    # unserved: the worker's claim did not read the jobs' Rate, and all three started.
    before = cyclone.step(
        name, concurrency=cyclone.Concurrency(10), rate=cyclone.Rate(1, timedelta(hours=1))
    )(lambda ctx, n: n)
    for n in range(3):
        before.enqueue(engine, n)
    after = cyclone.step(name, concurrency=cyclone.Concurrency(10))(lambda ctx, n: n)
    with cyclone.Worker(engine, steps=[after], sweep=False) as worker:
        assert worker.drain() == 1
    started = starts_per_second(engine, jobs.c.kind == name, jobs.c.attempted_at.is_not(None))
    assert sum(n for _, n in started) == 1
    with engine.begin() as conn:
        conn.execute(sa.delete(jobs).where(jobs.c.kind == name))


def test_a_rate_that_a_deploy_renamed_beside_a_kept_concurrency_wakes_its_worker_for_its_window(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    # Found by a review: the claim checked the jobs' earlier Rate, but the read of when a
    # limited job may next start knew only the definition's Rate: the worker slept until
    # its poll, not until the earlier Rate's next window.
    concurrency = cyclone.Concurrency(10, name=f"{name}-c")
    earlier = cyclone.Rate(1, timedelta(seconds=2), name=f"{name}-earlier")
    before = cyclone.step(name, concurrency=concurrency, rate=earlier)(lambda ctx, n: n)
    first, second = (before.enqueue(engine, n) for n in range(2))
    later = cyclone.Rate(100, timedelta(hours=1), name=f"{name}-later")
    after = cyclone.step(name, concurrency=concurrency, rate=later)(lambda ctx, n: n)
    serving(cyclone.Worker(engine, steps=[after], poll_interval=3600, sweep=False))
    assert first.wait(timeout=30).state.value == "completed"
    assert second.wait(timeout=30).state.value == "completed"


def test_a_rate_that_a_deploy_dropped_is_found_behind_a_newer_job_without_it(
    engine: sa.Engine, name: str
) -> None:
    # Found by a review: the worker looked for a dropped Rate in the first waiting job of
    # each limit only. A job enqueued after the deploy (without the Rate), at a higher
    # priority and due earlier, is first by either index the look may read, so the earlier
    # jobs' Rate was not found: all of them started.
    before = cyclone.step(
        name, concurrency=cyclone.Concurrency(10), rate=cyclone.Rate(1, timedelta(days=1))
    )(lambda ctx, n: n)
    for n in range(3):
        before.enqueue(engine, n)
    after = cyclone.step(name, concurrency=cyclone.Concurrency(10))(lambda ctx, n: n)
    due_earlier = datetime.now(UTC) - timedelta(hours=1)
    after.enqueue(engine, 3, priority=-1, run_at=due_earlier)
    try:
        with cyclone.Worker(engine, steps=[after], sweep=False) as worker:
            worker.drain()
        with engine.connect() as conn:
            started = dict(
                conn.execute(
                    sa.select(jobs.c.rate_name.is_not(None), sa.func.count())
                    .where(jobs.c.kind == name, jobs.c.attempted_at.is_not(None))
                    .group_by(jobs.c.rate_name.is_not(None))
                ).all()
            )
        assert started == {False: 1, True: 1}  # the newer job, and one of the earlier ones
    finally:
        with engine.begin() as conn:
            conn.execute(sa.delete(jobs).where(jobs.c.kind == name))
