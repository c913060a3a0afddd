"""Figure g: new-key submits from 8 processes at once, cyclone and raw in alternating turns,
with the CPU each submit cost the processes and the server."""

from __future__ import annotations

from bench import measure, procs
from bench.harness import Bench

SUBMITTERS = 8


def fig_g(bench: Bench) -> None:
    """Aggregate new-key submits from 8 processes, cyclone and raw, in alternating turns."""
    per_proc = bench.sizes.new_keys // SUBMITTERS * 2
    f = bench.fig(
        "g",
        f"submit_once new key, {SUBMITTERS} processes",
        "submits/s",
        True,
        goal=0.85,
        goal_text=">= 0.85x raw",
        raw_label=f"raw psycopg, {SUBMITTERS} processes",
    )
    cpu: dict[str, list[dict[str, float | None]]] = {"raw": [], "cyclone": []}
    for turn in range(2):
        for side in ("raw", "cyclone"):
            args = [
                (bench.sa_url, bench.dsn, side, f"g-{side}-{turn}-{p}", per_proc)
                for p in range(SUBMITTERS)
            ]
            timed = measure.spawn_timed(bench.mp, procs.submitter, args)
            (f.raw if side == "raw" else f.cyclone).append(timed.rate)
            # Where each submit's CPU went, and how much of the machine was busy: all of it
            # means the cores, not waits, set the rate.
            cpu[side].append(timed.cpu_per_call())
            print(f"  g turn {turn} {side}: {timed.describe('submits')}", flush=True)
    f.extra["cpu_per_submit"] = cpu
