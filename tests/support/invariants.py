"""The state that must always hold in cyclone's tables, written as queries.

Each invariant is a query that returns the rows breaking it (none when it holds).
:func:`violations` runs them all on a connection; :func:`check` fails with every broken
row listed. ``at_rest`` adds the invariants that hold only once no worker is serving
(after a test has stopped what it started): a running job then breaks the rule that
every running job belongs to a live worker, and a terminal run may not keep one either.
``drained`` adds those that hold once the workers have also done all they could before
stopping (the model-based test's end of each example): a test that leaves jobs queued
on purpose is at rest, not drained.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

TERMINAL_RUNS = "('completed', 'failed', 'cancelled')"
ACTIVE_JOBS = "('available', 'blocked', 'running')"


@dataclass(frozen=True, slots=True)
class Invariant:
    """One rule: its name, and a query returning the rows that break it."""

    name: str
    query: str
    at_rest_only: bool = False
    drained_only: bool = False


AT_MOST_MAX = "a Concurrency's key runs at most max jobs at once"
"""The invariant a limit lowered at runtime breaks until the jobs it ran then end (the
model-based test checks its own version of it then, knowing which jobs those are)."""


RUNS_AT_MOST_MAX = "a workflow limit's key has at most max runs in progress"
"""The invariant a workflow limit lowered at runtime breaks until the runs in progress then
end (the model-based test's model says when)."""


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "a job has a heartbeat exactly while it runs (the rescue's index holds the running)",
        """
        SELECT j.id AS job_id, j.run_id, j.kind, j.state, j.heartbeat_at FROM cyclone_jobs j
        WHERE (j.state = 'running') <> (j.heartbeat_at IS NOT NULL)
        """,
    ),
    Invariant(
        "a terminal run has no job waiting to run (available or blocked)",
        f"""
        SELECT r.id AS run_id, r.state AS run_state, j.id AS job_id, j.kind, j.state
        FROM cyclone_runs r JOIN cyclone_jobs j ON j.run_id = r.id
        WHERE r.state IN {TERMINAL_RUNS} AND j.state IN ('available', 'blocked')
        """,
    ),
    Invariant(
        "a terminal run has no running job once its workers have stopped",
        f"""
        SELECT r.id AS run_id, r.state AS run_state, j.id AS job_id, j.kind, j.worker_id
        FROM cyclone_runs r JOIN cyclone_jobs j ON j.run_id = r.id
        WHERE r.state IN {TERMINAL_RUNS} AND j.state = 'running'
        """,
        at_rest_only=True,
    ),
    Invariant(
        "a running, started run's steps_remaining equals its jobs not completed",
        """
        SELECT r.id AS run_id, r.steps_remaining,
               (SELECT count(*) FROM cyclone_jobs j
                WHERE j.run_id = r.id AND j.state <> 'completed') AS not_completed
        FROM cyclone_runs r
        WHERE r.state = 'running' AND r.start_at IS NULL
          AND r.steps_remaining <> (SELECT count(*) FROM cyclone_jobs j
                                    WHERE j.run_id = r.id AND j.state <> 'completed')
        """,
    ),
    Invariant(
        "a running, started run has a job for every step of its graph",
        """
        SELECT r.id AS run_id, jsonb_array_length(d.graph -> 'steps') AS steps,
               (SELECT count(*) FROM cyclone_jobs j
                WHERE j.run_id = r.id AND j.item IS NULL) AS jobs
        FROM cyclone_runs r JOIN cyclone_definitions d ON d.id = r.definition
        WHERE r.state = 'running' AND r.start_at IS NULL
          AND jsonb_array_length(d.graph -> 'steps')
              <> (SELECT count(*) FROM cyclone_jobs j WHERE j.run_id = r.id AND j.item IS NULL)
        """,
    ),
    Invariant(
        "every run's definition is stored, as a definition of the run's workflow",
        """
        SELECT r.id AS run_id, r.workflow, r.definition, d.workflow AS definition_workflow
        FROM cyclone_runs r LEFT JOIN cyclone_definitions d ON d.id = r.definition
        WHERE d.id IS NULL OR d.workflow <> r.workflow
        """,
    ),
    Invariant(
        "a run not started yet has no jobs",
        """
        SELECT r.id AS run_id, r.state FROM cyclone_runs r
        WHERE r.start_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM cyclone_jobs j WHERE j.run_id = r.id)
        """,
    ),
    Invariant(
        "a failed run's failed step is failed (a map node too, when one of its items failed it)",
        """
        SELECT r.id AS run_id, r.failed_step, j.id AS job_id, j.state
        FROM cyclone_runs r
        LEFT JOIN cyclone_jobs j
             ON j.run_id = r.id AND j.kind = r.failed_step AND j.item IS NULL
        WHERE r.state = 'failed' AND r.failed_step IS NOT NULL
          AND j.state IS DISTINCT FROM 'failed'
        """,
    ),
    Invariant(
        "a completed run has every job completed and no step remaining",
        """
        SELECT r.id AS run_id, r.steps_remaining, j.id AS job_id, j.kind, j.state
        FROM cyclone_runs r LEFT JOIN cyclone_jobs j
             ON j.run_id = r.id AND j.state <> 'completed'
        WHERE r.state = 'completed' AND (r.steps_remaining <> 0 OR j.id IS NOT NULL)
        """,
    ),
    Invariant(
        "a running run with no step remaining is not left running",
        """
        SELECT r.id AS run_id FROM cyclone_runs r
        WHERE r.state = 'running' AND r.start_at IS NULL AND r.steps_remaining = 0
        """,
    ),
    Invariant(
        "a step's pending_deps counts its upstream steps not completed, a map node parked "
        "for its items its items not completed (unless it ended)",
        f"""
        SELECT * FROM (
            SELECT j.id AS job_id, j.run_id, j.kind, j.state, j.pending_deps,
                   CASE WHEN j.state = 'running' AND j.item IS NULL AND EXISTS (
                            SELECT 1 FROM cyclone_jobs i
                            WHERE i.run_id = j.run_id AND i.kind = j.kind
                              AND i.item IS NOT NULL)
                        THEN j.pending_deps  -- being decided: the decision counts anew
                        WHEN j.state = 'blocked' AND j.item IS NULL AND EXISTS (
                            SELECT 1 FROM cyclone_jobs i
                            WHERE i.run_id = j.run_id AND i.kind = j.kind
                              AND i.item IS NOT NULL)
                        THEN (SELECT count(*) FROM cyclone_jobs i
                              WHERE i.run_id = j.run_id AND i.kind = j.kind
                                AND i.item IS NOT NULL AND i.state <> 'completed')
                        ELSE (SELECT count(*) FROM cyclone_jobs u
                              WHERE u.run_id = j.run_id AND u.kind = ANY (j.deps)
                                AND u.item IS NULL AND u.state <> 'completed')
                   END AS expected
            FROM cyclone_jobs j JOIN cyclone_runs r ON r.id = j.run_id
            WHERE r.state = 'running' AND j.state IN {ACTIVE_JOBS}
        ) counted
        WHERE pending_deps <> expected
        """,
    ),
    Invariant(
        "a map item belongs to a map node of its run, its deps among the node's",
        """
        SELECT i.id AS job_id, i.run_id, i.kind, i.item FROM cyclone_jobs i
        WHERE i.item IS NOT NULL AND (i.item < 0 OR NOT EXISTS (
            SELECT 1 FROM cyclone_jobs n
            WHERE n.run_id = i.run_id AND n.kind = i.kind AND n.item IS NULL
              AND i.deps <@ n.deps))
        """,
    ),
    Invariant(
        "a completed map node has one completed item per element of its output, whose "
        "outputs it is, in order",
        """
        SELECT n.id AS job_id, n.run_id, n.kind, jsonb_array_length(n.output) AS elements,
               count(*) AS items, count(*) FILTER (WHERE i.state = 'completed') AS completed
        FROM cyclone_jobs n
        JOIN cyclone_jobs i ON i.run_id = n.run_id AND i.kind = n.kind AND i.item IS NOT NULL
        WHERE n.item IS NULL AND n.state = 'completed'
        GROUP BY n.id
        HAVING jsonb_typeof(n.output) <> 'array'
            OR count(*) <> jsonb_array_length(n.output)
            OR count(*) FILTER (WHERE i.state = 'completed') <> count(*)
            OR max(i.item) <> count(*) - 1
            OR jsonb_agg(i.output ORDER BY i.item) <> n.output
        """,
    ),
    Invariant(
        "a fork names another run, of its own workflow while that run exists",
        """
        SELECT f.id AS run_id, f.workflow, f.forked_from, s.workflow AS source_workflow
        FROM cyclone_runs f LEFT JOIN cyclone_runs s ON s.id = f.forked_from
        WHERE f.forked_from IS NOT NULL
          AND (f.forked_from = f.id OR s.workflow <> f.workflow)
        """,
    ),
    Invariant(
        "a step completed without an attempt is a fork's kept step, with an output and a finish",
        """
        SELECT j.id AS job_id, j.run_id, j.kind, r.forked_from, j.finalized_at
        FROM cyclone_jobs j JOIN cyclone_runs r ON r.id = j.run_id
        WHERE j.state = 'completed' AND j.attempt = 0
          AND (r.forked_from IS NULL OR j.output IS NULL OR j.attempted_at IS NULL
               OR j.finalized_at > r.created_at)
        """,
    ),
    Invariant(
        "an available job has no upstream pending",
        """
        SELECT j.id AS job_id, j.kind, j.pending_deps FROM cyclone_jobs j
        WHERE j.state = 'available' AND j.pending_deps <> 0
        """,
    ),
    Invariant(
        "an available job has an attempt left and no owner (a retried job counts afresh)",
        """
        SELECT j.id AS job_id, j.kind, j.attempt, j.max_attempts, j.worker_id
        FROM cyclone_jobs j
        WHERE j.state = 'available' AND (j.attempt >= j.max_attempts OR j.worker_id IS NOT NULL)
        """,
    ),
    Invariant(
        "a paused queue says since when, and only a paused one",
        """
        SELECT q.name, q.paused, q.paused_at FROM cyclone_queues q
        WHERE q.paused <> (q.paused_at IS NOT NULL)
        """,
    ),
    Invariant(
        "every running job has an owner, a lease and a start",
        """
        SELECT j.id AS job_id, j.kind, j.worker_id, j.heartbeat_at, j.attempted_at
        FROM cyclone_jobs j
        WHERE j.state = 'running'
          AND (j.worker_id IS NULL OR j.heartbeat_at IS NULL OR j.attempted_at IS NULL
               OR j.attempt < 1)
        """,
    ),
    Invariant(
        "no job is running once every worker has stopped",
        """
        SELECT j.id AS job_id, j.run_id, j.kind, j.worker_id, j.heartbeat_at
        FROM cyclone_jobs j WHERE j.state = 'running'
        """,
        at_rest_only=True,
    ),
    Invariant(
        # A lost wake-up of a limit: its slot freed (its holder completed, failed, was
        # rescued, handed back, cancelled or purged) while no worker took it again.
        "no due job waits on a Concurrency whose key has room (a slot free, not taken)",
        """
        SELECT j.id AS job_id, j.run_id, j.kind, j.item, j.limit_name, j.limit_key, l.max,
               (SELECT count(*) FROM cyclone_jobs o
                WHERE o.limit_name = j.limit_name AND o.limit_key = j.limit_key
                  AND o.state = 'running') AS running
        FROM cyclone_jobs j
        JOIN cyclone_limits l ON l.name = j.limit_name
        LEFT JOIN cyclone_runs r ON r.id = j.run_id
        WHERE j.state = 'available' AND j.scheduled_at <= now() AND l.per IS NULL
          AND j.rate_name IS NULL
          AND (j.deadline IS NULL OR j.deadline > now())
          AND (j.run_id IS NULL OR r.state = 'running')
          AND NOT EXISTS (SELECT 1 FROM cyclone_queues q WHERE q.name = j.queue AND q.paused)
          AND (SELECT count(*) FROM cyclone_jobs o
               WHERE o.limit_name = j.limit_name AND o.limit_key = j.limit_key
                 AND o.state = 'running') < l.max
        """,
        drained_only=True,
    ),
    Invariant(
        "a limited job's limit and key have their rows",
        """
        SELECT j.id AS job_id, j.limit_name, j.limit_key FROM cyclone_jobs j
        WHERE j.limit_name IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM cyclone_limit_keys k
            WHERE k.name = j.limit_name AND k.key = j.limit_key)
        """,
    ),
    Invariant(
        "a child run sorts after its parent in the runs' lock order (created_at, id)",
        """
        SELECT c.id AS run_id, c.created_at, p.id AS parent_id, p.created_at AS parent_created_at
        FROM cyclone_runs c JOIN cyclone_runs p ON p.id = c.parent_id
        WHERE (c.created_at, c.id) <= (p.created_at, p.id)
        """,
    ),
    Invariant(
        "a child run names its parent node (and item), and its parent has that job",
        """
        SELECT c.id AS run_id, c.parent_id, c.parent_node, c.parent_item FROM cyclone_runs c
        WHERE (c.parent_id IS NULL) <> (c.parent_node IS NULL)
           OR c.parent_waits AND c.parent_id IS NULL
           OR c.parent_item IS NOT NULL AND c.parent_id IS NULL
           OR (c.parent_id IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM cyclone_jobs j
                WHERE j.run_id = c.parent_id AND j.kind = c.parent_node
                  AND j.item IS NOT DISTINCT FROM c.parent_item)
               -- a retry_all's new expansion over a shorter list leaves the children of
               -- the items it no longer has, awaited by none
               AND (c.parent_item IS NULL OR c.parent_waits OR NOT EXISTS (
                    SELECT 1 FROM cyclone_jobs n
                    WHERE n.run_id = c.parent_id AND n.kind = c.parent_node
                      AND n.item IS NULL)))
        """,
    ),
    Invariant(
        "a node of a run (an item, in a map of children) has at most one child run, and a "
        "map of children's children are its items'",
        """
        SELECT c.parent_id, c.parent_node, c.parent_item, count(*) AS children
        FROM cyclone_runs c
        WHERE c.parent_id IS NOT NULL
        GROUP BY c.parent_id, c.parent_node, c.parent_item HAVING count(*) > 1
        UNION ALL
        SELECT c.parent_id, c.parent_node, c.parent_item, 0 FROM cyclone_runs c
        WHERE c.parent_id IS NOT NULL AND c.parent_item IS NULL AND EXISTS (
            SELECT 1 FROM cyclone_jobs i
            WHERE i.run_id = c.parent_id AND i.kind = c.parent_node AND i.item IS NOT NULL)
        """,
    ),
    Invariant(
        "a running child its node waits for has that node waiting, or its parent ended",
        f"""
        SELECT c.id AS run_id, c.parent_id, c.parent_node, j.state AS node_state
        FROM cyclone_runs c
        JOIN cyclone_runs p ON p.id = c.parent_id
        JOIN cyclone_jobs j ON j.run_id = c.parent_id AND j.kind = c.parent_node
                           AND j.item IS NOT DISTINCT FROM c.parent_item
        WHERE c.parent_waits AND c.state = 'running' AND p.state = 'running'
          AND j.state NOT IN {ACTIVE_JOBS}
        """,
    ),
    Invariant(
        # A child run again (its own retry_all) after its node completed ends later than the
        # node: the node keeps the result it read until the parent runs it again.
        "a completed child node's (or item's) output is its child run's result, "
        "unless the child ended again after the node",
        """
        SELECT j.run_id, j.kind, j.item, c.id AS child_id FROM cyclone_jobs j
        JOIN cyclone_runs c ON c.parent_id = j.run_id AND c.parent_node = j.kind
                           AND j.item IS NOT DISTINCT FROM c.parent_item
        WHERE j.state = 'completed' AND c.state = 'completed'
          AND c.finalized_at <= j.finalized_at
          AND j.output IS DISTINCT FROM COALESCE(
                (SELECT r.output FROM cyclone_jobs r
                 WHERE r.run_id = c.id AND r.kind = c.result_step AND r.item IS NULL),
                'null'::jsonb)
        """,
    ),
    Invariant(
        "a child node parked for its ended child is in the delivery's range (no lost wake)",
        """
        SELECT c.id AS run_id, c.parent_id, c.parent_node, c.parent_item, c.state
        FROM cyclone_runs c
        JOIN cyclone_runs p ON p.id = c.parent_id
        JOIN cyclone_jobs j ON j.run_id = c.parent_id AND j.kind = c.parent_node
                           AND j.item IS NOT DISTINCT FROM c.parent_item
        WHERE c.state <> 'running' AND NOT c.parent_waits AND p.state = 'running'
          AND j.state = 'blocked' AND j.pending_deps = 0
        """,
    ),
    Invariant(
        "a job's Rate given with its Concurrency has its rows, and only then",
        """
        SELECT j.id AS job_id, j.rate_name, j.rate_key FROM cyclone_jobs j
        WHERE (j.rate_name IS NOT NULL AND (j.limit_name IS NULL OR NOT EXISTS (
                  SELECT 1 FROM cyclone_limit_keys k
                  WHERE k.name = j.rate_name AND k.key = j.rate_key)))
           OR (j.rate_name IS NULL) <> (j.rate_key IS NULL)
        """,
    ),
    Invariant(
        "a child node parked for its running child is awaited by it (its end wakes the node)",
        """
        SELECT c.id AS run_id, c.parent_id, c.parent_node, c.parent_item FROM cyclone_runs c
        JOIN cyclone_runs p ON p.id = c.parent_id
        JOIN cyclone_jobs j ON j.run_id = c.parent_id AND j.kind = c.parent_node
                           AND j.item IS NOT DISTINCT FROM c.parent_item
        WHERE c.state = 'running' AND NOT c.parent_waits AND p.state = 'running'
          AND j.state = 'blocked' AND j.pending_deps = 0
        """,
    ),
    Invariant(
        AT_MOST_MAX,
        """
        SELECT j.limit_name, j.limit_key, l.max, count(*) AS running
        FROM cyclone_jobs j JOIN cyclone_limits l ON l.name = j.limit_name
        WHERE j.state = 'running' AND l.per IS NULL
        GROUP BY j.limit_name, j.limit_key, l.max HAVING count(*) > l.max
        """,
    ),
    Invariant(
        "a step, or a map item, has the limits and keys its run keeps for it (none when it "
        "keeps none; a map node's are its items', under 'items', and the node has none)",
        """
        SELECT j.id AS job_id, j.kind, j.item, j.limit_name, j.limit_key, r.step_limits
        FROM cyclone_jobs j JOIN cyclone_runs r ON r.id = j.run_id,
        LATERAL (SELECT CASE WHEN j.item IS NULL THEN r.step_limits -> j.kind
                             ELSE r.step_limits -> j.kind -> 'items' END AS kept) s
        WHERE (s.kept ->> 'n') IS DISTINCT FROM j.limit_name
           OR (s.kept ->> 'k') IS DISTINCT FROM j.limit_key
           OR (s.kept ->> 'rn') IS DISTINCT FROM j.rate_name
           OR (s.kept ->> 'rk') IS DISTINCT FROM j.rate_key
        """,
    ),
    Invariant(
        "a run's step limits and keys have their rows",
        """
        SELECT r.id AS run_id, s.key AS step, s.value AS step_limit
        FROM cyclone_runs r, jsonb_each(r.step_limits) s,
        LATERAL (SELECT coalesce(s.value -> 'items', s.value) AS kept) l
        WHERE r.step_limits IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM cyclone_limit_keys k
            WHERE k.name = l.kept ->> 'n' AND k.key = l.kept ->> 'k')
        """,
    ),
    Invariant(
        "a limited run's limit and key have their rows",
        """
        SELECT r.id AS run_id, r.limit_name, r.limit_key FROM cyclone_runs r
        WHERE r.limit_name IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM cyclone_limit_keys k
            WHERE k.name = r.limit_name AND k.key = r.limit_key)
        """,
    ),
    Invariant(
        "a run held back has a limit, the start it asked for, and no steps",
        """
        SELECT r.id AS run_id, r.limit_name, r.limit_start_at FROM cyclone_runs r
        WHERE r.start_at = 'infinity'
          AND (r.limit_name IS NULL OR r.limit_start_at IS NULL
               OR EXISTS (SELECT 1 FROM cyclone_jobs j WHERE j.run_id = r.id))
        """,
    ),
    Invariant(
        RUNS_AT_MOST_MAX,
        """
        SELECT r.limit_name, r.limit_key, l.max, count(*) AS in_progress
        FROM cyclone_runs r JOIN cyclone_limits l ON l.name = r.limit_name
        WHERE r.state = 'running' AND (r.start_at IS NULL OR r.start_at < 'infinity')
        GROUP BY r.limit_name, r.limit_key, l.max HAVING count(*) > l.max
        """,
    ),
    Invariant(
        "a Rate's key started at most max attempts in its current window",
        """
        SELECT k.name, k.key, k.window_start, k.window_count, l.max
        FROM cyclone_limit_keys k JOIN cyclone_limits l ON l.name = k.name
        WHERE l.per IS NOT NULL AND k.window_count > l.max
        """,
    ),
    Invariant(
        "a key's version counts at least the claims of its current window",
        """
        SELECT k.name, k.key, k.version, k.window_count FROM cyclone_limit_keys k
        WHERE k.version < k.window_count OR k.window_count < 0
        """,
    ),
    Invariant(
        "a worker's record as waiting for work lapses within a minute (Worker WAIT_RECORD)",
        """
        SELECT w.worker_id, w.waits_until FROM cyclone_waiters w
        WHERE w.waits_until > now() + interval '61 seconds'
        """,
    ),
)
"""Every invariant; ``at_rest_only`` ones hold once no worker serves the database."""


def violations(
    conn: sa.Connection, *, at_rest: bool, drained: bool = False, skip: tuple[str, ...] = ()
) -> dict[str, list[dict[str, object]]]:
    """The rows breaking each invariant, by the invariant's name (only broken ones), but
    those named in ``skip``."""
    assert set(skip) <= {i.name for i in INVARIANTS}, f"no invariant is named {skip}"
    broken: dict[str, list[dict[str, object]]] = {}
    for invariant in INVARIANTS:
        if (invariant.at_rest_only and not at_rest) or (invariant.drained_only and not drained):
            continue
        if invariant.name in skip:
            continue
        rows = conn.execute(sa.text(invariant.query + " LIMIT 20")).mappings().all()
        if rows:
            broken[invariant.name] = [dict(row) for row in rows]
    return broken


def check(
    engine_or_conn: sa.Engine | sa.Connection,
    *,
    at_rest: bool = True,
    drained: bool = False,
    skip: tuple[str, ...] = (),
) -> None:
    """Raise AssertionError listing every broken invariant, with up to 20 rows each
    (``drained``: with those that hold once the workers did all they could, at rest),
    but those named in ``skip``."""
    assert at_rest or not drained, "drained is at rest"
    if isinstance(engine_or_conn, sa.Engine):
        with engine_or_conn.connect() as conn:
            broken = violations(conn, at_rest=at_rest, drained=drained, skip=skip)
    else:
        broken = violations(engine_or_conn, at_rest=at_rest, drained=drained, skip=skip)
    if broken:
        lines = ["cyclone's invariants are broken:"]
        for name, rows in broken.items():
            lines.append(f"  {name}:")
            lines.extend(f"    {row}" for row in rows)
        raise AssertionError("\n".join(lines))
