"""Migrations: single head, up, down, up again, no drift, the CLI, concurrent upgrades."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

import cyclone
from cyclone import migrations, schema
from cyclone.schema import metadata
from tests.conftest import wait_until
from tests.support import processes

REPO = Path(__file__).resolve().parent.parent
START_GATE = 0x7465737467617465  # "testgate"


@pytest.fixture
def fresh_engine(fresh_database: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    yield engine
    engine.dispose()


def cyclone_objects(engine: sa.Engine) -> dict[str, set[str]]:
    """cyclone's tables, functions and triggers in the database."""
    with engine.connect() as conn:
        tables = set(
            conn.execute(
                sa.text(
                    "SELECT tablename FROM pg_tables "
                    "WHERE schemaname = 'public' AND tablename LIKE 'cyclone%'"
                )
            ).scalars()
        )
        functions = set(
            conn.execute(
                sa.text("SELECT proname FROM pg_proc WHERE proname LIKE 'cyclone%'")
            ).scalars()
        )
        triggers = set(
            conn.execute(
                sa.text("SELECT tgname FROM pg_trigger WHERE tgname LIKE 'cyclone%'")
            ).scalars()
        )
    return {"tables": tables, "functions": functions, "triggers": triggers}


def version_rows(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(sa.text("SELECT version_num FROM cyclone_alembic_version")).scalars()
        )


def drift(engine: sa.Engine) -> list[object]:
    def include_name(name: str | None, type_: str, parent_names: object) -> bool:
        if type_ == "table":
            return name != migrations.VERSION_TABLE
        return True

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_name": include_name}
        )
        return list(compare_metadata(context, metadata))


def alembic_cli(*args: str, url: URL) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CYCLONE_DATABASE_URL": url.render_as_string(hide_password=False)}
    return processes.run(
        [sys.executable, "-m", "alembic", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_revisions_have_a_single_head() -> None:
    """One head, one base; and the head and revisions that cyclone reads from the files
    without alembic (to check a schema) are alembic's."""
    config = Config()
    config.set_main_option("script_location", migrations.script_location())
    script = ScriptDirectory.from_config(config)
    assert len(script.get_heads()) == 1
    assert script.get_current_head() == migrations.head_revision()
    assert {rev.revision for rev in script.walk_revisions()} == migrations.revision_ids()
    bases = script.get_bases()
    assert len(bases) == 1


def test_revision_files_that_do_not_read_simply_leave_the_lineage_to_alembic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    versions = tmp_path / "versions"
    versions.mkdir()
    (versions / "a.py").write_text('revision = "a"\ndown_revision = None\n')
    (versions / "b.py").write_text('revision: str = "b"\ndown_revision = "a"\n')
    monkeypatch.setattr(migrations, "script_location", lambda: str(tmp_path))
    assert migrations._read_lineage() == ("b", frozenset({"a", "b"}))
    (versions / "c.py").write_text('revision = "c"\ndown_revision = "a"\n')  # two heads
    assert migrations._read_lineage() is None
    (versions / "c.py").write_text('revision = "c"\ndown_revision = ("a", "b")\n')  # a merge
    assert migrations._read_lineage() is None


def test_upgrade_on_a_fresh_database_creates_the_schema(fresh_engine: sa.Engine) -> None:
    assert migrations.current_revision(fresh_engine) is None
    with pytest.raises(cyclone.SchemaError):
        cyclone.check_schema(fresh_engine)
    cyclone.upgrade(fresh_engine)
    cyclone.check_schema(fresh_engine)
    assert version_rows(fresh_engine) == [migrations.head_revision()]
    objects = cyclone_objects(fresh_engine)
    assert objects["tables"] == {
        "cyclone_runs",
        "cyclone_jobs",
        "cyclone_schedules",
        "cyclone_signals",
        "cyclone_leader",
        "cyclone_queues",
        "cyclone_limits",
        "cyclone_limit_keys",
        "cyclone_waiters",
        "cyclone_workers",
        "cyclone_definitions",
        "cyclone_alembic_version",
    }
    assert objects["functions"] == {
        "cyclone_notify_job_changed",
        "cyclone_notify_run_finished",
        "cyclone_ring",
        "cyclone_uuid7",
    }
    # New jobs notify from cyclone's insert statements (cyclone_0004), not by trigger.
    assert objects["triggers"] == {"cyclone_jobs_state_changed", "cyclone_runs_finished"}


def statistics(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT stxname FROM pg_statistic_ext")).scalars())


def test_upgrade_creates_the_claim_statistics_and_their_downgrade_drops_them(
    fresh_engine: sa.Engine,
) -> None:
    def analyzed() -> tuple[float, int]:
        with fresh_engine.connect() as conn:
            reltuples = conn.execute(
                sa.text("SELECT reltuples FROM pg_class WHERE relname = 'cyclone_jobs'")
            ).scalar_one()
            built = conn.execute(
                sa.text("SELECT count(*) FROM pg_stats_ext WHERE statistics_name = :n"),
                {"n": schema.CLAIM_STATISTICS},
            ).scalar_one()
        return reltuples, built

    cyclone.upgrade(fresh_engine)
    assert statistics(fresh_engine) == {schema.CLAIM_STATISTICS}
    # An empty table is left never analyzed: analyzed empty, it is planned as empty.
    assert analyzed() == (-1, 0)
    cyclone.downgrade(fresh_engine, "cyclone_0023_rated_jobs_index")
    assert statistics(fresh_engine) == set()
    with fresh_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, max_attempts) "
                "SELECT 'k', 'default', 0, 'available', 1 FROM generate_series(1, 100)"
            )
        )
    cyclone.upgrade(fresh_engine)  # a table holding jobs is analyzed: the claim uses them
    assert statistics(fresh_engine) == {schema.CLAIM_STATISTICS}
    assert analyzed() == (100, 1)
    with fresh_engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM cyclone_jobs"))


def test_upgrade_counts_limit_keys_as_many_analyzes_tables_with_rows_and_downgrade_resets(
    fresh_engine: sa.Engine,
) -> None:
    """``limit_key``'s ``n_distinct`` of 10,000 (cyclone_0029_limit_key_distinct) on both
    tables; a table with rows is analyzed, so the option holds at once; an empty one is
    left never analyzed."""

    def options() -> dict[str, list[str]]:
        with fresh_engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT c.relname, a.attoptions FROM pg_attribute a "
                    "JOIN pg_class c ON c.oid = a.attrelid WHERE a.attname = 'limit_key' "
                    "AND c.relname IN ('cyclone_jobs', 'cyclone_runs')"
                )
            ).all()
        return {name: [o for o in opts or () if o.startswith("n_distinct=")] for name, opts in rows}

    def n_distinct(table: str) -> float | None:
        with fresh_engine.connect() as conn:
            value = conn.execute(
                sa.text(
                    "SELECT n_distinct FROM pg_stats WHERE tablename = :t AND attname = 'limit_key'"
                ),
                {"t": table},
            ).scalar()
        return None if value is None else float(value)

    cyclone.upgrade(fresh_engine)
    assert options() == {
        "cyclone_jobs": ["n_distinct=10000"],
        "cyclone_runs": ["n_distinct=10000"],
    }
    assert n_distinct("cyclone_jobs") is None  # empty: never analyzed
    cyclone.downgrade(fresh_engine, "cyclone_0028_heartbeat_index")
    assert options() == {"cyclone_jobs": [], "cyclone_runs": []}
    with fresh_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, max_attempts, "
                "limit_name, limit_key) SELECT 'k', 'default', 0, 'available', 1, 'kind:k', "
                "'key-' || (g % 4) FROM generate_series(1, 100) g"
            )
        )
    cyclone.upgrade(fresh_engine)  # analyzed: the claim's probes are planned on it now
    assert n_distinct("cyclone_jobs") == 10000
    with fresh_engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM cyclone_jobs"))


def test_downgrade_from_0004_restores_the_insert_trigger(fresh_engine: sa.Engine) -> None:
    cyclone.upgrade(fresh_engine)
    cyclone.downgrade(fresh_engine, "cyclone_0003")
    assert "cyclone_jobs_inserted" in cyclone_objects(fresh_engine)["triggers"]
    cyclone.upgrade(fresh_engine)
    assert "cyclone_jobs_inserted" not in cyclone_objects(fresh_engine)["triggers"]


def test_upgrade_twice_is_fine(fresh_engine: sa.Engine) -> None:
    cyclone.upgrade(fresh_engine)
    cyclone.upgrade(fresh_engine)
    assert version_rows(fresh_engine) == [migrations.head_revision()]


def test_upgrade_leaves_no_drift_from_the_metadata(fresh_engine: sa.Engine) -> None:
    cyclone.upgrade(fresh_engine)
    assert drift(fresh_engine) == []


def test_drift_check_sees_a_difference(fresh_engine: sa.Engine) -> None:
    """The no-drift test would notice a change: drop a column and it reports one."""
    cyclone.upgrade(fresh_engine)
    with fresh_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE cyclone_runs DROP COLUMN retention"))
        conn.execute(sa.text("ALTER TABLE cyclone_jobs ALTER COLUMN priority TYPE integer"))
    kinds = {diff[0][0] if isinstance(diff, list) else diff[0] for diff in drift(fresh_engine)}
    assert "add_column" in kinds
    assert "modify_type" in kinds


def test_downgrade_to_base_removes_everything_and_upgrade_works_again(
    fresh_engine: sa.Engine,
) -> None:
    cyclone.upgrade(fresh_engine)
    cyclone.downgrade(fresh_engine)
    objects = cyclone_objects(fresh_engine)
    assert objects["tables"] <= {"cyclone_alembic_version"}
    assert objects["functions"] == set()
    assert objects["triggers"] == set()
    assert migrations.current_revision(fresh_engine) is None
    cyclone.upgrade(fresh_engine)
    cyclone.check_schema(fresh_engine)
    assert drift(fresh_engine) == []


def test_alembic_cli_upgrade_head_and_downgrade_base(
    fresh_database: URL, fresh_engine: sa.Engine
) -> None:
    up = alembic_cli("upgrade", "head", url=fresh_database)
    assert up.returncode == 0, up.stderr
    cyclone.check_schema(fresh_engine)
    assert version_rows(fresh_engine) == [migrations.head_revision()]
    assert drift(fresh_engine) == []
    with fresh_engine.connect() as conn:
        names = set(
            conn.execute(
                sa.text(
                    "SELECT conname FROM pg_constraint WHERE conrelid::regclass::text = ANY(:t)"
                ),
                {"t": list(metadata.tables)},
            ).scalars()
        )
    assert names == {str(c.name) for table in metadata.tables.values() for c in table.constraints}

    down = alembic_cli("downgrade", "base", url=fresh_database)
    assert down.returncode == 0, down.stderr
    objects = cyclone_objects(fresh_engine)
    assert objects["tables"] <= {"cyclone_alembic_version"}
    assert objects["functions"] == set()
    assert migrations.current_revision(fresh_engine) is None


def test_alembic_cli_without_a_database_url_fails_clearly() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CYCLONE_DATABASE_URL"}
    result = processes.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "CYCLONE_DATABASE_URL" in result.stderr


def test_concurrent_upgrade_from_threads(fresh_database: URL) -> None:
    engines = [sa.create_engine(fresh_database, poolclass=sa.NullPool) for _ in range(4)]
    barrier = threading.Barrier(len(engines))

    def upgrade(engine: sa.Engine) -> None:
        barrier.wait(timeout=30)
        cyclone.upgrade(engine)

    try:
        with ThreadPoolExecutor(len(engines)) as pool:
            for future in [pool.submit(upgrade, engine) for engine in engines]:
                future.result(timeout=60)
        assert version_rows(engines[0]) == [migrations.head_revision()]
        cyclone.check_schema(engines[0])
    finally:
        for engine in engines:
            engine.dispose()


UPGRADE_CHILD = """
import sys
import sqlalchemy as sa
import cyclone

engine = sa.create_engine(sys.argv[1], poolclass=sa.NullPool)
with engine.connect() as gate:
    gate.execute(sa.text("SELECT pg_advisory_lock_shared(:k)"), {"k": int(sys.argv[2])})
    gate.execute(sa.text("SELECT pg_advisory_unlock_shared(:k)"), {"k": int(sys.argv[2])})
cyclone.upgrade(engine)
print("ok")
"""


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_concurrent_upgrade_from_processes(fresh_database: URL, fresh_engine: sa.Engine) -> None:
    url = fresh_database.render_as_string(hide_password=False)
    with fresh_engine.connect() as gate:
        gate.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": START_GATE})
        children = [
            processes.popen(
                [sys.executable, "-c", UPGRADE_CHILD, url, str(START_GATE)],
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(4)
        ]
        try:
            # Every child is at the gate: blocked on the shared lock we hold.
            def waiting() -> bool:
                for child in children:
                    if child.poll() is not None:  # died before the gate: fail now
                        pytest.fail(f"a child exited early: {child.communicate()[1]}")
                count = gate.execute(
                    sa.text(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                        "AND NOT granted AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database())"
                    )
                ).scalar_one()
                gate.commit()  # the session-level gate lock stays held
                return bool(count == len(children))

            wait_until(waiting, timeout=90)
        finally:
            gate.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": START_GATE})
            gate.commit()
        outputs = [child.communicate(timeout=60) for child in children]
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
        assert out.strip() == "ok"
    assert version_rows(fresh_engine) == [migrations.head_revision()]
    cyclone.check_schema(fresh_engine)


def index_oid(engine: sa.Engine, name: str) -> int:
    with engine.connect() as conn:
        oid = conn.execute(sa.text("SELECT CAST(:n AS regclass)::oid"), {"n": name})
        return int(oid.scalar_one())


CLAIM_KIND_INDEX = (
    "CREATE INDEX {how} ix_cyclone_jobs_claim_kind ON cyclone_jobs "
    "(kind, priority, scheduled_at, id) WHERE state = 'available' AND workflow IS NULL"
)


def test_an_index_built_beforehand_concurrently_is_kept(fresh_engine: sa.Engine) -> None:
    cyclone.upgrade(fresh_engine, "cyclone_0002")
    with fresh_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(CLAIM_KIND_INDEX.format(how="CONCURRENTLY"))
    built = index_oid(fresh_engine, "ix_cyclone_jobs_claim_kind")
    # Kept by cyclone_0003, up to cyclone_0022_kind_claim_index, which rebuilds it.
    cyclone.upgrade(fresh_engine, "cyclone_0021_child_items")
    assert index_oid(fresh_engine, "ix_cyclone_jobs_claim_kind") == built
    cyclone.upgrade(fresh_engine)
    assert version_rows(fresh_engine) == [migrations.head_revision()]
    assert drift(fresh_engine) == []


RATED_INDEX = (
    "CREATE INDEX {how} ix_cyclone_jobs_rated ON cyclone_jobs (limit_name, rate_name) "
    "WHERE state = 'available' AND rate_name IS NOT NULL"
)


def test_the_rated_jobs_index_built_beforehand_concurrently_is_kept_and_dropped_by_the_downgrade(
    fresh_engine: sa.Engine,
) -> None:
    cyclone.upgrade(fresh_engine, "cyclone_0022_kind_claim_index")
    with fresh_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(RATED_INDEX.format(how="CONCURRENTLY"))
    built = index_oid(fresh_engine, "ix_cyclone_jobs_rated")
    cyclone.upgrade(fresh_engine)
    assert version_rows(fresh_engine) == [migrations.head_revision()]
    assert index_oid(fresh_engine, "ix_cyclone_jobs_rated") == built
    assert drift(fresh_engine) == []
    cyclone.downgrade(fresh_engine, "cyclone_0022_kind_claim_index")
    with fresh_engine.connect() as conn:
        found = conn.execute(sa.text("SELECT to_regclass('ix_cyclone_jobs_rated')")).scalar()
    assert found is None
    cyclone.upgrade(fresh_engine)
    assert drift(fresh_engine) == []


@pytest.mark.parametrize(
    ("before", "name", "definition"),
    [
        ("cyclone_0002", "ix_cyclone_jobs_claim_kind", CLAIM_KIND_INDEX),
        ("cyclone_0022_kind_claim_index", "ix_cyclone_jobs_rated", RATED_INDEX),
    ],
)
def test_an_invalid_index_left_by_a_failed_build_stops_the_upgrade(
    fresh_engine: sa.Engine, before: str, name: str, definition: str
) -> None:
    cyclone.upgrade(fresh_engine, before)
    with fresh_engine.begin() as conn:
        conn.exec_driver_sql(definition.format(how=""))
        # What a CREATE INDEX CONCURRENTLY that failed half-way leaves behind.
        conn.exec_driver_sql(
            f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{name}'::regclass"
        )
    with pytest.raises(sa.exc.DBAPIError, match=f"{name} exists but is invalid"):
        cyclone.upgrade(fresh_engine)
    assert version_rows(fresh_engine) == [before]
    with fresh_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP INDEX {name}")
    cyclone.upgrade(fresh_engine)
    assert drift(fresh_engine) == []


BEFORE_DEFINITIONS = "cyclone_0019_waiters"


def _in_flight_before_definitions(engine: sa.Engine, graph: str, old_graph: str) -> dict[str, Any]:
    """Runs of workflow ``inflight`` written as the revision before cyclone_0020_definitions
    kept them (each with its graph): one not started, one whose first step completed and
    second is available, and one not started of an older one-step graph. Their ids by name."""
    ids = {name: uuid.uuid4() for name in ("unstarted", "midway", "older")}
    insert_run = sa.text(
        "INSERT INTO cyclone_runs (id, workflow, submit_key, input, graph, steps_remaining, "
        "start_at) VALUES (:id, 'inflight', :key, '7', CAST(:graph AS jsonb), :steps, :start)"
    )
    with engine.begin() as c:
        c.execute(
            insert_run,
            {
                "id": ids["unstarted"],
                "key": "u",
                "graph": graph,
                "steps": 2,
                "start": datetime.now(UTC),
            },
        )
        c.execute(
            insert_run, {"id": ids["midway"], "key": "m", "graph": graph, "steps": 1, "start": None}
        )
        c.execute(
            insert_run,
            {
                "id": ids["older"],
                "key": "o",
                "graph": old_graph,
                "steps": 1,
                "start": datetime.now(UTC),
            },
        )
        c.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, state, output, deps, "
                "pending_deps, attempt, max_attempts, finalized_at) VALUES "
                "(:id, 'inflight', 'first', 'default', 'completed', '1', '{}', 0, 1, 3, now()), "
                "(:id, 'inflight', 'second', 'default', 'available', NULL, '{first}', 0, 0, 3, "
                "NULL)"
            ),
            {"id": ids["midway"]},
        )
    return ids


def test_upgrade_to_definitions_moves_graphs_of_runs_in_flight_which_then_finish(
    fresh_engine: sa.Engine,
) -> None:
    calls: list[tuple[str, Any]] = []
    old: cyclone.Workflow[Any] = cyclone.Workflow("inflight")
    old.step("first")(lambda ctx, value: calls.append(("first-old", value)))
    new: cyclone.Workflow[Any] = cyclone.Workflow("inflight")

    @new.step()
    def first(ctx: cyclone.StepContext, value: Any) -> int:
        calls.append(("first", value))
        return 1

    @new.step(after=[first])
    def second(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append(("second", ctx.output(first)))

    cyclone.upgrade(fresh_engine, BEFORE_DEFINITIONS)
    ids = _in_flight_before_definitions(fresh_engine, new.plan().graph, old.plan().graph)
    cyclone.upgrade(fresh_engine)
    cyclone.check_schema(fresh_engine)
    assert drift(fresh_engine) == []
    with fresh_engine.connect() as c:
        versions = c.execute(
            sa.text(
                "SELECT workflow, jsonb_array_length(graph -> 'steps') FROM cyclone_definitions"
            )
        ).all()
        assert sorted(versions) == [("inflight", 1), ("inflight", 2)]  # one row per graph
        named = dict(c.execute(sa.text("SELECT id, definition FROM cyclone_runs")).all())
    assert named[ids["unstarted"]] == named[ids["midway"]] != named[ids["older"]]

    assert cyclone.Worker(fresh_engine, workflows=[new]).drain() == 4
    states = {name: cyclone.Client(fresh_engine).get_run(i) for name, i in ids.items()}
    assert {name: s.state for name, s in states.items() if s} == dict.fromkeys(
        ids, cyclone.RunState.COMPLETED
    )
    # The run of the older graph ran its own version: one step, no second.
    assert sorted(calls) == [("first", 7), ("first", 7), ("second", 1), ("second", 1)]
    with fresh_engine.connect() as c:
        kinds = (
            c.execute(
                sa.text("SELECT kind FROM cyclone_jobs WHERE run_id = :id"), {"id": ids["older"]}
            )
            .scalars()
            .all()
        )
    assert kinds == ["first"]
    # A new submit of the current definition stores its own version next to the moved ones.
    run, _ = new.submit_once(fresh_engine, "after", 8)
    assert cyclone.Worker(fresh_engine, workflows=[new]).drain() == 2
    assert run.status().state is cyclone.RunState.COMPLETED


def test_downgrade_from_definitions_gives_each_run_its_graph_back(fresh_engine: sa.Engine) -> None:
    wf = workflow_of_two("inflight")
    cyclone.upgrade(fresh_engine, BEFORE_DEFINITIONS)
    graph = wf.plan().graph
    ids = _in_flight_before_definitions(fresh_engine, graph, graph)
    with fresh_engine.connect() as c:
        before = dict(c.execute(sa.text("SELECT id, graph FROM cyclone_runs")).all())
    cyclone.upgrade(fresh_engine)
    cyclone.downgrade(fresh_engine, BEFORE_DEFINITIONS)
    with fresh_engine.connect() as c:
        after = dict(c.execute(sa.text("SELECT id, graph FROM cyclone_runs")).all())
    assert after == before
    assert set(after) == set(ids.values())
    cyclone.upgrade(fresh_engine)
    assert drift(fresh_engine) == []


def workflow_of_two(name: str) -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("first")(lambda ctx, value: 1)
    wf.step("second", after=["first"])(lambda ctx, value: None)
    return wf


BEFORE_WORKER_RESCUE_AFTER = "cyclone_0025_workers"


def test_upgrade_to_worker_rescue_after_leaves_registered_workers_to_the_leaders_rule(
    fresh_engine: sa.Engine,
) -> None:
    """Workers registered by the code of cyclone_0025_workers, one silent for ten minutes
    holding a job and one beating, when the revision lands: their rows record no
    ``rescue_after``, so a leader judges them and their jobs by its own, as before; a
    worker of this version records its own. The downgrade drops the column, rows kept."""
    kind = cyclone.step("inflight.kind")(lambda ctx, value: value)
    cyclone.upgrade(fresh_engine, BEFORE_WORKER_RESCUE_AFTER)
    job = kind.enqueue(fresh_engine, 5)
    with fresh_engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO cyclone_workers (worker_id, host, pid, concurrency, workflows, "
                "steps, version, started_at, heartbeat_at) VALUES "
                "('old:1:silent', 'old', 1, 1, '{}', '{inflight.kind}', '0.1.0', "
                "now() - interval '1 hour', now() - interval '10 minutes'), "
                "('old:2:beating', 'old', 2, 1, '{}', '{inflight.kind}', '0.1.0', "
                "now() - interval '1 hour', now())"
            )
        )
        c.execute(
            sa.text(
                "UPDATE cyclone_jobs SET state = 'running', worker_id = 'old:1:silent', "
                "attempt = 1, lease = lease + 1, heartbeat_at = now() - interval '10 minutes' "
                "WHERE id = :id"
            ),
            {"id": job.id},
        )
    cyclone.upgrade(fresh_engine)
    cyclone.check_schema(fresh_engine)
    assert drift(fresh_engine) == []
    client = cyclone.Client(fresh_engine)
    assert [(w.id, w.rescue_after) for w in client.list_workers()] == [
        ("old:1:silent", None),
        ("old:2:beating", None),
    ]
    seen: list[list[tuple[str, Any]]] = []
    kind_seen = cyclone.step("inflight.kind")(
        lambda ctx, value: seen.append([(w.id, w.rescue_after) for w in client.list_workers()])
    )
    worker = cyclone.Worker(
        fresh_engine, steps=[kind_seen], rescue_after=timedelta(minutes=1), sweep=False
    )
    assert worker.drain() == 1  # the silent worker's job, handed back by the leader's rule
    assert seen == [[("old:2:beating", None), (worker.id, timedelta(minutes=1))]]
    assert [w.id for w in client.list_workers()] == ["old:2:beating"]
    done = client.get_job(job.id)
    assert done is not None
    assert done.state is cyclone.JobState.COMPLETED
    cyclone.downgrade(fresh_engine, BEFORE_WORKER_RESCUE_AFTER)
    with fresh_engine.connect() as c:
        assert c.execute(sa.text("SELECT worker_id FROM cyclone_workers")).scalars().all() == [
            "old:2:beating"
        ]
    cyclone.upgrade(fresh_engine)
    assert drift(fresh_engine) == []


BEFORE_TIME_ORDERED_IDS = "cyclone_0026_worker_rescue_after"


def _clock_ms(engine: sa.Engine) -> int:
    with engine.connect() as c:
        return int(
            c.execute(
                sa.text("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)")
            ).scalar_one()
        )


def test_upgrade_to_time_ordered_ids_keeps_the_ids_of_runs_in_flight_and_orders_new_ones(
    fresh_engine: sa.Engine,
) -> None:
    """Runs submitted (one of them started) before the revision keep their random ids and
    finish; runs submitted after it get version 7 ids whose first 48 bits are the
    server's clock in milliseconds, so later runs sort after earlier ones. The downgrade
    gives new runs random ids again."""
    wf = workflow_of_two("ordered")
    cyclone.upgrade(fresh_engine, BEFORE_TIME_ORDERED_IDS)
    waiting, _ = wf.submit_once(fresh_engine, "before-waiting", 1)
    started, _ = wf.submit_once(fresh_engine, "before-started", 2)
    with fresh_engine.begin() as c:  # midway: its first step completed, its second available
        c.execute(
            sa.text("UPDATE cyclone_runs SET start_at = NULL, steps_remaining = 1 WHERE id = :id"),
            {"id": started.id},
        )
        c.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, state, output, deps, "
                "pending_deps, attempt, max_attempts, finalized_at) VALUES "
                "(:id, 'ordered', 'first', 'default', 'completed', '1', '{}', 0, 1, 3, now()), "
                "(:id, 'ordered', 'second', 'default', 'available', NULL, '{first}', 0, 0, 3, "
                "NULL)"
            ),
            {"id": started.id},
        )
    assert {waiting.id.version, started.id.version} == {4}

    cyclone.upgrade(fresh_engine)
    cyclone.check_schema(fresh_engine)
    assert drift(fresh_engine) == []
    with fresh_engine.connect() as c:
        assert set(c.execute(sa.text("SELECT id FROM cyclone_runs")).scalars()) == {
            waiting.id,
            started.id,
        }
    low = _clock_ms(fresh_engine)
    new = []
    for i in range(5):
        run, _ = wf.submit_once(fresh_engine, f"after-{i}", i)
        new.append(run.id)
    batch = wf.submit_once_many(fresh_engine, [(f"batch-{i}", i) for i in range(3)])
    high = _clock_ms(fresh_engine)
    ids = [*new, *(run.id for run, _ in batch)]
    assert {i.version for i in ids} == {7}
    stamps = [i.int >> 80 for i in ids]
    assert low <= stamps[0]
    assert stamps[-1] <= high
    assert stamps == sorted(stamps)
    assert len(set(ids)) == len(ids)

    assert cyclone.Worker(fresh_engine, workflows=[wf]).drain() == 2 + 1 + 2 * len(ids)
    client = cyclone.Client(fresh_engine)
    for run_id in (waiting.id, started.id, *ids):
        status = client.get_run(run_id)
        assert status is not None
        assert status.state is cyclone.RunState.COMPLETED

    cyclone.downgrade(fresh_engine, BEFORE_TIME_ORDERED_IDS)
    assert "cyclone_uuid7" not in cyclone_objects(fresh_engine)["functions"]
    after, _ = wf.submit_once(fresh_engine, "downgraded", 9)
    assert after.id.version == 4
    cyclone.upgrade(fresh_engine)
    assert drift(fresh_engine) == []
