"""Tables and charts: the printed table (rich when installed), its Markdown twin for the
README, and the PNG charts (matplotlib, imported only when a chart is drawn).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.results import ROOT, Figure


def fmt(value: float | None) -> str:
    """A measured value with the digits that mean something: 1,234 / 12.3 / 1.23."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def human(n: int) -> str:
    """A count as a label: 10k, 1M."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table, as pasted into bench/README.md."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def print_rows(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    width: int = 160,
    right: Sequence[str] = (),
    style: Callable[[Sequence[str]], str | None] = lambda row: None,
) -> None:
    """Print a table with rich (columns in ``right`` right-aligned, rows styled by
    ``style``), or as aligned plain text without it."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
        for r in [headers, *rows]:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        return
    table = Table(title=title)
    for h in headers:
        table.add_column(h, justify="right" if h in right else "left", overflow="fold")
    for r in rows:
        table.add_row(*r, style=style(r))
    Console(width=width).print(table)


def publish(png: Path, name: str) -> None:
    """Copy a chart to ``docs/name``, where the READMEs show it."""
    (ROOT / "docs").mkdir(exist_ok=True)
    shutil.copyfile(png, ROOT / "docs" / name)
    print(f"wrote {png} and docs/{name}")


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(plt: Any, fig: Any, title: str, path: Path) -> None:
    """Title the chart, lay it out and write it as a PNG."""
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- the table and chart of bench.run ---------------------------------------------------------

HEADERS = ["figure", "unit", "cyclone", "raw", "baseline", "cyclone/raw", "goal", "got", "met"]


def table_rows(figures: Sequence[Figure]) -> list[list[str]]:
    """One row per figure: medians, the ratio to the baseline, the goal and whether it is met."""
    rows = []
    for f in figures:
        met = {True: "yes", False: "NO", None: ""}[f.met]
        rows.append(
            [
                f.title,
                f.unit,
                fmt(f.cyclone_median),
                fmt(f.raw_median),
                f.raw_label,
                "-" if f.ratio is None else f"{f.ratio:.2f}",
                f.goal_text,
                "" if f.goal is None or f.goal_ratio is None else f"{f.goal_ratio:.2f}x",
                met,
            ]
        )
    return rows


def print_figures(figures: Sequence[Figure], statements: dict[str, dict[str, float]]) -> None:
    """The figures' table, then the statements counted per operation."""
    print_rows(
        "cyclone vs raw psycopg (medians over rounds)",
        HEADERS,
        table_rows(figures),
        right=("cyclone", "raw", "cyclone/raw"),
        style=lambda r: {"NO": "red", "yes": "green"}.get(r[-1]),
    )
    print_rows(
        "statements per operation (counted at the driver cursor)",
        ["operation", "statements", "transactions", "by kind"],
        [
            [
                op,
                f"{counts['statements']:.2f}",
                f"{counts['transactions']:.2f}",
                ", ".join(f"{k.strip()} {v:.2f}" for k, v in counts.items() if k.startswith("  ")),
            ]
            for op, counts in statements.items()
        ],
        right=("statements", "transactions"),
    )


def chart(figures: Sequence[Figure], path: Path, meta: dict[str, Any]) -> None:
    """Two panels: how far each goal is met, and cyclone's speed beside its baseline."""
    plt = pyplot()
    goals = [f for f in figures if f.goal is not None and f.goal_ratio]
    rate = [f for f in figures if f.higher_is_better and f.raw and not f.id.startswith("a-ref")]
    lat = [f for f in figures if not f.higher_is_better and f.raw]
    fig, axes = plt.subplots(2, 1, figsize=(12, 14), gridspec_kw={"height_ratios": [1, 1.7]})

    ax = axes[0]
    scores = []
    for f in goals:
        assert f.goal is not None
        assert f.goal_ratio is not None
        scores.append(f.goal_ratio / f.goal if f.higher_is_better else f.goal / f.goal_ratio)
    names = [f"{f.title} ({f.goal_text})" for f in goals]
    colors = ["tab:green" if s >= 1 else "tab:red" for s in scores]
    ax.barh(names, scores, color=colors)
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax.invert_yaxis()
    ax.set_xlabel("goal attainment (>= 1 means the goal is met)")
    ax.set_title("Goals")

    ax = axes[1]
    # Batches compare cyclone with itself one at a time: their goal panel shows them.
    compared = [
        f for f in (*rate, *lat) if f.cyclone_median and f.raw_median and not f.id.startswith("c")
    ]
    # One linear axis for every figure: how fast cyclone is relative to its baseline
    # (throughput ratio, or inverse latency ratio), so 1.0 means as fast as the baseline.
    speed = [
        (f.cyclone_median or 0) / (f.raw_median or 1)
        if f.higher_is_better
        else (f.raw_median or 0) / (f.cyclone_median or 1)
        for f in compared
    ]
    ax.barh(
        [f"{f.title} (vs {f.raw_label})" for f in compared],
        speed,
        color=["tab:blue" if s >= 1 else "tab:orange" for s in speed],
    )
    ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
    for y, value in enumerate(speed):
        ax.text(value, y, f" {value:.2f}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("cyclone's speed relative to the baseline (linear; 1.0 = as fast)")
    ax.set_title("cyclone beside its baseline, same run, same server")
    title = (
        f"cyclone benchmark, {meta['date']} — {meta['nproc']} cores, PostgreSQL "
        f"{meta['postgres']}, Python {meta['python']}, "
        f"medians of {meta.get('rounds_done', meta['rounds'])} rounds"
    )
    save_figure(plt, fig, title, path)


# --- the table and chart of bench.peers -------------------------------------------------------

PEER_COLUMNS = [
    ("new_per_s", "1. new keys/s", True),
    ("dup_us", "2. duplicate µs/call", False),
    ("jobs_per_s", "3. drain jobs/s", True),
    ("p50_ms", "4. submit->finished p50 ms", False),
    ("p99_ms", "4. p99 ms", False),
]
"""Each peers figure's key in the results, its column title, and whether higher is better."""
PEER_HEADERS = ["system", *(title for _k, title, _h in PEER_COLUMNS)]


def times(r: float) -> str:
    """A ratio to raw: 0.75x, or 0.0001x for the tiny ones."""
    return f"{r:.2f}x" if r >= 0.01 else f"{r:.4f}x"


def peer_cell(results: dict[str, Any], name: str, key: str) -> tuple[str, float | None]:
    """The shown value with its ratio to raw, and the ratio alone (None if n/a)."""
    got = results["systems"].get(name, {})
    if key not in got:
        why = got.get("why", {}).get(key) or got.get("why", {}).get("*") or "not run"
        return f"n/a ({why})", None
    raw = results["systems"].get("raw", {}).get(key)
    value = got[key]
    if not raw:
        return fmt(value), None
    return f"{fmt(value)} ({times(value / raw)})", value / raw


def peer_rows(results: dict[str, Any]) -> list[list[str]]:
    """One row per system, each figure's value with its ratio to raw."""
    return [
        [name, *(peer_cell(results, name, key)[0] for key, _title, _higher in PEER_COLUMNS)]
        for name in results["order"]
    ]


def print_peers(results: dict[str, Any]) -> None:
    print_rows(
        "cyclone and its peers (value, and ratio to raw in the same run)",
        PEER_HEADERS,
        peer_rows(results),
        width=200,
    )


def peers_chart(results: dict[str, Any], path: Path) -> None:
    """One panel per figure: every system's ratio to raw, on a linear axis."""
    plt = pyplot()
    names = results["order"]
    cols = PEER_COLUMNS
    fig, axes = plt.subplots(1, len(cols), figsize=(4 * len(cols), 0.5 * len(names) + 2.5))
    for ax, (key, title, higher) in zip(axes, cols, strict=True):
        ratios = [peer_cell(results, name, key)[1] for name in names]
        ys = list(range(len(names)))
        colors = [
            "tab:gray" if n == "raw" else "tab:blue" if n == "cyclone" else "tab:orange"
            for n in names
        ]
        ax.barh(ys, [r or 0 for r in ratios], color=colors)
        for y, r in zip(ys, ratios, strict=True):
            ax.text(r or 0, y, f" {times(r)}" if r is not None else " n/a", va="center", fontsize=8)
        ax.axvline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set_yticks(ys, names)
        ax.invert_yaxis()
        ax.set_xlim(0, max([r or 0 for r in ratios] + [1.0]) * 1.3)
        better = "higher is better" if higher else "lower is better"
        ax.set_title(f"{title}\nx raw, linear ({better})", fontsize=9)
    meta = results["meta"]
    title = (
        f"cyclone and its peers, ratio to raw psycopg in the same run — {meta['date']}, "
        f"{meta['nproc']} cores, PostgreSQL {meta['postgres']}, "
        f"load {meta['loadavg_start'][0]:.2f}"
    )
    save_figure(plt, fig, title, path)
