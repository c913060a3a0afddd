"""What a bench run records: one :class:`Figure` per row, the run's facts, the JSON files.

Results go to ``bench/results`` (or the folder ``CYCLONE_BENCH_RESULTS`` names); charts
meant for the docs are copied to ``docs/``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(os.environ.get("CYCLONE_BENCH_RESULTS") or ROOT / "bench" / "results")
"""Where results go: ``bench/results``, or the folder ``CYCLONE_BENCH_RESULTS`` names."""


@dataclass
class Figure:
    """One row of the table: cyclone's values and the baseline's, one per round."""

    id: str
    title: str
    unit: str
    higher_is_better: bool
    cyclone: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    raw_label: str = "raw psycopg"
    goal: float | None = None
    goal_text: str = ""
    goal_base: list[float] | None = None
    """The values the goal ratio is taken against (default: ``raw``)."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cyclone_median(self) -> float | None:
        return statistics.median(self.cyclone) if self.cyclone else None

    @property
    def raw_median(self) -> float | None:
        return statistics.median(self.raw) if self.raw else None

    @property
    def ratio(self) -> float | None:
        c, r = self.cyclone_median, self.raw_median
        return None if c is None or not r else c / r

    @property
    def goal_ratio(self) -> float | None:
        base = self.raw if self.goal_base is None else self.goal_base
        c = self.cyclone_median
        if c is None or not base:
            return None
        b = statistics.median(base)
        return c / b if b else None

    @property
    def met(self) -> bool | None:
        if self.goal is None or self.goal_ratio is None:
            return None
        if self.higher_is_better:
            return self.goal_ratio >= self.goal
        return self.goal_ratio <= self.goal

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            cyclone_median=self.cyclone_median,
            raw_median=self.raw_median,
            ratio=self.ratio,
            goal_ratio=self.goal_ratio,
            met=self.met,
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Figure:
        """The figure :meth:`to_json` wrote (its derived values are recomputed)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def git_describe() -> str:
    """The commit measured, marked when cyclone/ or alembic/ differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "cyclone", "alembic"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + (" (cyclone/ modified)" if dirty else "")


def meta(postgres: str, **more: Any) -> dict[str, Any]:
    """The facts every results file starts with: when, where, on what; then ``more``."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git_describe(),
        "nproc": os.cpu_count(),
        "postgres": postgres,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_start": os.getloadavg(),
        **more,
    }


def save(name: str, data: dict[str, Any]) -> Path:
    """Write ``data`` to ``RESULTS/name`` (indented JSON) and say so; the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(data, indent=2))
    print(f"wrote {path}", flush=True)
    return path


def load(name: str) -> dict[str, Any]:
    """What :func:`save` wrote to ``RESULTS/name``."""
    data: dict[str, Any] = json.loads((RESULTS / name).read_text())
    return data
