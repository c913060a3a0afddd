"""The four figures of ``python -m bench.peers``, each for every system in one run:
(1) new keys through the library's deduplication, (2) the same keys again, (3) a no-op
drain by the library's worker with its defaults, (4) submit -> finished with idle workers.

Every system gets a throwaway database per figure (``cyclone_peers_<system>_<hex>``),
its schema installed through its own API, dropped at the end.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import URL

from bench import db, measure
from bench.systems import SYSTEMS, System

TURNS = 10
"""Turns of figures 1 and 2: each system's calls are split into this many runs."""


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


def fig_latency(admin: URL, names: Sequence[str], sizes: Sizes) -> dict[str, Any]:
    """Figure 4: one idle worker process per system, all up; tries rotate across systems."""
    names = [n for n in names if not SYSTEMS[n].only]
    mp = multiprocessing.get_context("spawn")
    procs: list[Any] = []
    samples: dict[str, list[float]] = {n: [] for n in names}
    with databases(admin, names) as systems:
        try:
            for s in systems.values():
                out: Any = mp.Queue()
                proc = s.spawn_serve(mp, out)
                proc.start()
                procs.append(proc)
                measure.ready(out, 1)
            time.sleep(2.0)  # the workers' start-up (listeners, pools, DBOS launch)
            for s in systems.values():
                s.open()
            for i in range(-3, sizes.tries):  # three untimed warm-up tries
                for name, s in systems.items():
                    took = s.ping(i + 1000 if i < 0 else i)
                    if i >= 0:
                        samples[name].append(took * 1e3)
                    time.sleep(0.05)
        finally:
            for s in systems.values():
                if hasattr(s, "runner") or hasattr(s, "conn") or hasattr(s, "engine"):
                    try:
                        s.close()
                    except Exception as exc:
                        print(f"  {s.name}: close failed: {exc!r}", file=sys.stderr)
            stop = getattr(systems.get("raw"), "_stop", None)
            if stop is not None:
                stop.set()
            measure.stop(procs, timeout=15, terminate=True)
    return {
        name: {
            "p50_ms": statistics.median(v),
            "p99_ms": measure.percentile(v, 99),
            "samples_ms": v,
        }
        for name, v in samples.items()
        if v
    }
