"""The schema: CHECK value lists match the enums; metadata shape and naming."""

from __future__ import annotations

import re

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

import cyclone
from cyclone.schema import NAMING_CONVENTION, jobs, metadata, runs
from cyclone.states import TERMINAL_JOB_STATES, TERMINAL_RUN_STATES


def quoted_values(sql: str) -> set[str]:
    return set(re.findall(r"'([a-z_]+)'", sql))


def database_checks(conn: sa.Connection, table: str) -> dict[str, str]:
    rows = conn.execute(
        sa.text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = CAST(:table AS regclass) AND contype = 'c'"
        ),
        {"table": table},
    )
    return {name: definition for name, definition in rows}


def metadata_check(table: sa.Table, name: str) -> str:
    for constraint in table.constraints:
        if isinstance(constraint, sa.CheckConstraint) and constraint.name == name:
            # As the DDL renders it: the values are literals.
            sqltext = constraint.sqltext.compile(
                dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}
            )
            return str(sqltext)
    raise AssertionError(f"{table.name} has no CHECK {name}")


def test_run_state_check_lists_every_run_state(conn: sa.Connection) -> None:
    expected = {state.value for state in cyclone.RunState}
    assert quoted_values(metadata_check(runs, "ck_cyclone_runs_state")) == expected
    checks = database_checks(conn, "cyclone_runs")
    assert quoted_values(checks["ck_cyclone_runs_state"]) == expected


def test_job_state_check_lists_every_job_state(conn: sa.Connection) -> None:
    expected = {state.value for state in cyclone.JobState}
    assert quoted_values(metadata_check(jobs, "ck_cyclone_jobs_state")) == expected
    checks = database_checks(conn, "cyclone_jobs")
    assert quoted_values(checks["ck_cyclone_jobs_state"]) == expected


def test_finalized_at_checks_list_the_terminal_states(conn: sa.Connection) -> None:
    run_terminal = {state.value for state in TERMINAL_RUN_STATES}
    job_terminal = {state.value for state in TERMINAL_JOB_STATES}
    assert quoted_values(metadata_check(runs, "ck_cyclone_runs_finalized_at")) == run_terminal
    assert quoted_values(metadata_check(jobs, "ck_cyclone_jobs_finalized_at")) == job_terminal
    assert (
        quoted_values(database_checks(conn, "cyclone_runs")["ck_cyclone_runs_finalized_at"])
        == run_terminal
    )
    assert (
        quoted_values(database_checks(conn, "cyclone_jobs")["ck_cyclone_jobs_finalized_at"])
        == job_terminal
    )


def test_states_are_str_enums() -> None:
    assert cyclone.RunState.FAILED == "failed"
    assert {s.name for s in cyclone.RunState} == {"RUNNING", "COMPLETED", "FAILED", "CANCELLED"}
    assert set(cyclone.RunState) - TERMINAL_RUN_STATES == {cyclone.RunState.RUNNING}


def test_submit_key_index_is_unique_per_workflow_name(conn: sa.Connection) -> None:
    indexdef = conn.execute(
        sa.text("SELECT indexdef FROM pg_indexes WHERE indexname = 'idx_runs_submit_key'")
    ).scalar_one()
    assert "CREATE UNIQUE INDEX idx_runs_submit_key ON public.cyclone_runs" in indexdef
    assert "(workflow, submit_key)" in indexdef
    (index,) = [i for i in runs.indexes if i.name == "idx_runs_submit_key"]
    assert index.unique
    assert [c.name for c in index.columns] == ["workflow", "submit_key"]


def test_metadata_holds_only_cyclone_tables() -> None:
    assert set(metadata.tables) == {
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
    }
    assert metadata.naming_convention == NAMING_CONVENTION


def metadata_constraint_names() -> set[str]:
    return {
        str(constraint.name)
        for table in metadata.tables.values()
        for constraint in table.constraints
    }


def test_constraint_names_follow_the_naming_convention(conn: sa.Connection) -> None:
    """The revision makes the names the metadata has, not a convention applied twice."""
    names = set(
        conn.execute(
            sa.text(
                "SELECT conname FROM pg_constraint WHERE conrelid IN "
                "('cyclone_runs'::regclass, 'cyclone_jobs'::regclass, "
                "'cyclone_schedules'::regclass, 'cyclone_signals'::regclass, "
                "'cyclone_leader'::regclass, 'cyclone_queues'::regclass, "
                "'cyclone_limits'::regclass, 'cyclone_limit_keys'::regclass, "
                "'cyclone_waiters'::regclass, 'cyclone_workers'::regclass, "
                "'cyclone_definitions'::regclass)"
            )
        ).scalars()
    )
    assert names == {
        "pk_cyclone_runs",
        "pk_cyclone_jobs",
        "fk_cyclone_jobs_run_id_cyclone_runs",
        "fk_cyclone_runs_parent_id_cyclone_runs",
        "ck_cyclone_runs_state",
        "ck_cyclone_runs_finalized_at",
        "ck_cyclone_runs_steps_remaining",
        "ck_cyclone_jobs_state",
        "ck_cyclone_jobs_finalized_at",
        "ck_cyclone_jobs_max_attempts",
        "ck_cyclone_jobs_attempt",
        "ck_cyclone_jobs_lost",
        "ck_cyclone_jobs_run_or_standalone",
        "pk_cyclone_schedules",
        "ck_cyclone_schedules_cron_or_every",
        "ck_cyclone_schedules_missed",
        "ck_cyclone_schedules_max_catch_up",
        "pk_cyclone_signals",
        "fk_cyclone_signals_run_id_cyclone_runs",
        "ck_cyclone_signals_sent",
        "pk_cyclone_leader",
        "ck_cyclone_leader_term",
        "pk_cyclone_queues",
        "ck_cyclone_queues_paused_at",
        "pk_cyclone_limits",
        "ck_cyclone_limits_max",
        "ck_cyclone_limits_per",
        "ck_cyclone_limits_on_limit",
        "ck_cyclone_limits_counts",
        "pk_cyclone_limit_keys",
        "fk_cyclone_limit_keys_name_cyclone_limits",
        "pk_cyclone_waiters",
        "pk_cyclone_workers",
        "pk_cyclone_definitions",
    }
    assert names == metadata_constraint_names()


def test_include_name_keeps_cyclone_tables_out_of_an_apps_autogenerate() -> None:
    from cyclone.schema import include_name

    assert not include_name("cyclone_runs", "table", {})
    assert not include_name("cyclone_alembic_version", "table", {})
    assert include_name("orders", "table", {})
    assert include_name("ix_anything", "index", {})
