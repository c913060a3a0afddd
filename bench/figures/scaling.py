"""Figure l: how throughput scales with processes here, the figures under docs/scaling.md.

New-key submits from 1, 2, 4 and 8 submitter processes, and 3-step workflow steps drained
by 1, 2, 4 and 8 worker processes, each beside the raw psycopg equivalent in the same
run (raw has no workflow: its row is the SKIP LOCKED loop over as many no-op jobs).
"""

from __future__ import annotations

from bench import measure, procs, workloads
from bench.figures.jobs import RAW_LABEL, cyclone_rate, raw_rate
from bench.harness import Bench

PROCESSES = (1, 2, 4, 8)


def fig_l(bench: Bench) -> None:
    """Submits/s and workflow steps/s against the number of processes."""
    for nproc in PROCESSES:
        f = bench.fig(
            f"l-submit-{nproc}p",
            f"scaling: submit_once new key, {nproc} proc",
            "submits/s",
            True,
            raw_label=f"raw psycopg, {nproc} proc",
        )
        per_proc = max(bench.sizes.new_keys // 2, bench.sizes.new_keys * 2 // nproc)
        for side in ("raw", "cyclone"):
            bench.reset()
            args = [
                (bench.sa_url, bench.dsn, side, f"l-{side}-{nproc}-{p}", per_proc)
                for p in range(nproc)
            ]
            timed = measure.spawn_timed(bench.mp, procs.submitter, args)
            (f.raw if side == "raw" else f.cyclone).append(timed.rate)
            print(f"  l submit {nproc} proc {side}: {timed.describe('submits')}", flush=True)
    runs = bench.sizes.jobs // 3
    for nproc in PROCESSES:
        f = bench.fig(
            f"l-steps-{nproc}p",
            f"scaling: 3-step wf steps, {nproc} proc",
            "steps/s",
            True,
            raw_label=RAW_LABEL,
        )
        bench.reset()
        f.raw.append(raw_rate(bench, runs * 3, nproc))
        bench.reset()
        items = [(f"l{nproc}-{i}", workloads.payload(i)) for i in range(runs)]
        for start in range(0, runs, 1000):
            workloads.three_step.submit_once_many(bench.engine, items[start : start + 1000])
        f.cyclone.append(cyclone_rate(bench, "workflow", runs * 3, nproc))
        print(f"  l steps {nproc} proc: cyclone {f.cyclone[-1]:,.0f}, raw {f.raw[-1]:,.0f}")
