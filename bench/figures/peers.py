"""The four figures of ``python -m bench.peers``, each for every system in one run:
(1) new keys through the library's deduplication, (2) the same keys again, (3) a no-op
drain by the library's worker with its defaults, (4) submit -> finished with an
idle worker, each system alone.

Every system gets a throwaway database per figure (``cyclone_peers_<system>_<hex>``),
its schema installed through its own API, dropped at the end.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from bench import db, measure
from bench.systems import SYSTEMS, System

TURNS = 10
"""Turns of figures 1 and 2: each system's calls are split into this many runs."""

ROUNDS = 3
"""Rounds of figure 4: each system's tries are split into this many runs, the systems
taking turns, so that the VM's drift hits them alike."""

WARMUP_TRIES = 3
"""Untimed tries of figure 4 after each start of a worker."""

WARMUP_BASE = 1_000_000
"""Added to a warm-up try's number, so that its key is never a timed try's."""


@dataclass
class Sizes:
    new_keys: int = 2_000
    duplicates: int = 1_000
    jobs: int = 2_000
    tries: int = 30


@contextmanager
def databases(admin: URL, names: Sequence[str]) -> Iterator[dict[str, System]]:
    """A fresh database per system, its schema installed; all dropped at the end."""
    made: dict[str, System] = {}
    try:
        for name in names:
            system = SYSTEMS[name](db.create_database(admin, f"cyclone_peers_{name}"))
            made[name] = system
            system.install()
        yield made
    finally:
        for system in made.values():
            db.drop_database(admin, system.url)


def fig_submit(admin: URL, names: Sequence[str], sizes: Sizes) -> dict[str, Any]:
    """Figures 1 and 2, every system taking turns (TURNS turns of n / TURNS calls each)."""
    names = [n for n in names if not SYSTEMS[n].no_dedup and not SYSTEMS[n].only]
    n, dups = sizes.new_keys, min(sizes.duplicates, sizes.new_keys)
    result: dict[str, Any] = {}
    with databases(admin, names) as systems:
        for s in systems.values():
            s.open()
        try:
            for s in systems.values():  # warm-up, keys above the timed ones
                s.new(range(n, n + measure.WARMUP))
                s.dup(range(n, n + measure.WARMUP))
            new_t = measure.turn_times({name: (s.new, n) for name, s in systems.items()}, TURNS)
            dup_t = measure.turn_times({name: (s.dup, dups) for name, s in systems.items()}, TURNS)
        finally:
            for s in systems.values():
                s.close()
        for name, s in systems.items():
            rows = s.sql(s.count_sql)
            if rows != n + measure.WARMUP:
                print(
                    f"  warning: {name} holds {rows} rows for {n + measure.WARMUP} keys",
                    file=sys.stderr,
                )
            result[name] = {
                "new_per_s": n / new_t[name],
                "dup_us": 1e6 * dup_t[name] / dups,
                "rows": rows,
            }
    return result


def fig_drain(admin: URL, names: Sequence[str], sizes: Sizes) -> dict[str, Any]:
    """Figure 3: n pre-enqueued no-op jobs, drained by one worker process with its defaults."""
    mp = multiprocessing.get_context("spawn")
    result: dict[str, Any] = {}
    for name in names:
        with databases(admin, [name]) as systems:
            s = systems[name]
            s.open()
            try:
                s.preload(sizes.jobs)
            finally:
                s.close()
            s.analyze()
            start = mp.Event()
            out: Any = mp.Queue()
            proc = s.spawn_drain(mp, sizes.jobs, start, out)
            proc.start()
            try:
                measure.ready(out, 1)
                start.set()
                _kind, (t0, t1, done) = out.get(timeout=600)
            finally:
                measure.stop([proc])
            result[name] = {"jobs_per_s": done / (t1 - t0), "done": done, "of": sizes.jobs}
            print(f"  {name}: {done} of {sizes.jobs} jobs in {t1 - t0:.2f} s", flush=True)
    return result


def fig_latency(
    admin: URL,
    names: Sequence[str],
    sizes: Sizes,
    elsewhere: dict[str, Callable[[int, int], list[float]]] | None = None,
    rounds: int = ROUNDS,
) -> dict[str, Any]:
    """Figure 4: each system alone with its idle worker, in ``rounds`` rounds.

    In every round each system in turn starts its worker, takes WARMUP_TRIES untimed
    tries and its share of the timed ones 50 ms apart, then stops it, so no system is
    timed beside another's worker. ``elsewhere`` maps a system run by another
    interpreter (oban) to a call that times ``n`` tries there from try number ``first``
    and returns them in ms; it takes its turn in each round like the others.
    """
    names = [n for n in names if not SYSTEMS[n].only]
    elsewhere = elsewhere or {}
    mp = multiprocessing.get_context("spawn")
    samples: dict[str, list[float]] = {n: [] for n in [*names, *elsewhere]}
    per_round = -(-sizes.tries // rounds)
    with databases(admin, names) as systems:
        for r in range(rounds):
            n = min(per_round, sizes.tries - r * per_round)
            if n <= 0:
                break
            for name in samples:
                if name in elsewhere:
                    samples[name] += elsewhere[name](r * per_round, n)
                else:
                    samples[name] += tries_alone(mp, systems[name], r * per_round, n)
    return {
        name: {
            "p50_ms": statistics.median(v),
            "p99_ms": measure.percentile(v, 99),
            "samples_ms": v,
        }
        for name, v in samples.items()
        if v
    }


def tries_alone(mp: Any, s: System, first: int, n: int) -> list[float]:
    """Tries ``first`` .. ``first + n - 1`` of ``s`` in ms, after WARMUP_TRIES untimed
    ones, with its idle worker (started here, stopped at the end) the only one up."""
    out: Any = mp.Queue()
    proc = s.spawn_serve(mp, out)
    proc.start()
    took: list[float] = []
    try:
        measure.ready(out, 1)
        time.sleep(2.0)  # the worker's start-up (listeners, pools, DBOS launch)
        s.open()
        try:
            for i in range(-WARMUP_TRIES, n):
                t = s.ping(WARMUP_BASE + first + i if i < 0 else first + i)
                if i >= 0:
                    took.append(t * 1e3)
                time.sleep(0.05)
        finally:
            s.close()
    finally:
        stop = getattr(s, "_stop", None)
        if stop is not None:
            stop.set()
        measure.stop([proc], timeout=15, terminate=True)
    return took
