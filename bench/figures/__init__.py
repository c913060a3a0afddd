"""The figures of ``python -m bench.run``, one module per group.

Figures a to e run in every round (:data:`ROUNDS`); g to l once each after the rounds
(:data:`ONCE`); f last of all (its million-row fill misplans what would follow it).
:data:`ORDER` is the order of the rows in the table and the JSON results.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.figures import (
    bouncer,
    growth,
    jobs,
    latency,
    memory,
    mixed,
    scaling,
    submit,
    submitters,
)
from bench.harness import Bench

LETTERS = "abcdefghijkl"

ROUNDS: dict[str, Callable[[Bench, int], None]] = {
    "a": submit.fig_a,
    "b": submit.fig_b,
    "c": submit.fig_c,
    "d": jobs.fig_d,
    "e": latency.fig_e,
}
"""Figures measured in every round: ``figure(bench, round)``."""

ONCE: dict[str, Callable[[Bench], None]] = {
    "g": submitters.fig_g,
    "h": jobs.fig_h,
    "i": mixed.fig_i,
    "j": memory.fig_j,
    "k": bouncer.fig_k,
    "l": scaling.fig_l,
}
"""Figures measured once, after the rounds: ``figure(bench)``."""

LAST: dict[str, Callable[[Bench], None]] = {"f": growth.fig_f}
"""Measured after everything else."""

ORDER = [
    "a1",
    "a5",
    "a-ref-auto",
    "a-ref-begin",
    "b",
    "c100",
    "c1000",
    "d-jobs-1p",
    "d-wf-1p",
    "d-jobs-2p",
    "d-wf-2p",
    "e-p50",
    "e-p99",
    "f-sub-small",
    "f-sub-large",
    "f-claim-small",
    "f-claim-large",
    "g",
    "h-1p",
    "h-2p",
    "h-4p",
    "h-wf-1p",
    "i-submits",
    "i-steps",
    "i-p50",
    "i-p99",
    "j-10k",
    "j-100k",
    "j-fail",
    "k",
    "k-ref-direct",
    *(f"l-submit-{n}p" for n in scaling.PROCESSES),
    *(f"l-steps-{n}p" for n in scaling.PROCESSES),
]
"""The table's rows in order; a figure not listed (``d-jobs-foreign``) comes after them."""
