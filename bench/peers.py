"""cyclone beside the Python libraries a user would pick instead, on the same figures.

Run from the repository root (never from the test suite)::

    .venv/bin/pip install -e '.[bench,bench-peers]'
    .venv/bin/python -m bench.peers                  # N = 2,000, 30 pings
    .venv/bin/python -m bench.peers --quick          # small N, a smoke run
    .venv/bin/python -m bench.peers --only dbos,raw  # some systems only

Four figures, each for the raw psycopg baseline, cyclone and every peer, in one run
against one server: (1) new keys submitted one at a time through the library's
deduplication feature, (2) re-submitting existing keys, (3) draining pre-enqueued no-op
jobs with the library's worker and its defaults, (4) submit -> finished latency with an
idle worker. Each system gets a throwaway database per figure, with its schema installed
through its own documented command or API. oban (Python >= 3.12) runs in a separate
interpreter when this one cannot import it (``--oban-python``). The systems are in
``bench/systems/`` (the peers imported lazily, so that the bench type-checks and imports
without them), the figures in ``bench/figures/peers.py``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as ``python bench/peers.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy.engine import URL, make_url

import cyclone
from bench import db, report, results
from bench.figures.peers import Sizes, databases, fig_drain, fig_latency, fig_submit, tries_alone
from bench.results import ROOT
from bench.systems import SYSTEMS

CHART = ROOT / "docs" / "bench-peers.png"


def oban_elsewhere(python: str, admin: URL, figures: str, sizes: Sizes, first: int = 0) -> Any:
    """Figure 3 or 4 of oban, run by ``python`` (a >= 3.12 venv with oban and cyclone):
    its JSON (for figure 4, ``sizes.tries`` tries numbered from ``first``)."""
    cmd = [
        python,
        "-m",
        "bench.peers",
        "--child-oban",
        "--url",
        admin.render_as_string(hide_password=False),
        "--figures",
        figures,
        "--jobs",
        str(sizes.jobs),
        "--tries",
        str(sizes.tries),
        "--first",
        str(first),
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"oban run failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_oban(admin: URL, figures: str, sizes: Sizes, first: int) -> dict[str, Any]:
    """Inside the >= 3.12 interpreter: oban's figure 3 (its result) or a round of figure
    4 (``{"samples_ms": [...]}``), as :func:`oban_elsewhere` reads them."""
    if figures == "3":
        meta = {"python": platform.python_version(), "versions": versions(["oban"])}
        return {**fig_drain(admin, ["oban"], sizes)["oban"], "meta": meta}
    mp = multiprocessing.get_context("spawn")
    with databases(admin, ["oban"]) as systems:
        return {"samples_ms": tries_alone(mp, systems["oban"], first, sizes.tries)}


def failed(why: dict[str, str], exc: Exception) -> None:
    """Keep why oban's run in the other interpreter failed: its figures are left out."""
    why["*"] = f"its run failed: {exc}"[:300]


def oban_tries(python: str, admin: URL, why: dict[str, str]) -> Callable[[int, int], list[float]]:
    """Figure 4's turn of oban in one round: its tries in ms, or none once a run failed
    (the reason kept in ``why``)."""

    def tries(first: int, n: int) -> list[float]:
        if "*" in why:
            return []
        try:
            data = oban_elsewhere(python, admin, "4", Sizes(tries=n), first)
        except Exception as exc:
            failed(why, exc)
            return []
        samples: list[float] = data["samples_ms"]
        return samples

    return tries


def draw(data: dict[str, Any]) -> None:
    (ROOT / "docs").mkdir(exist_ok=True)
    report.peers_chart(data, CHART)
    print("wrote docs/bench-peers.png")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("CYCLONE_DATABASE_URL", db.DEFAULT_URL),
        help="server URL (throwaway databases are created on it)",
    )
    parser.add_argument("--only", default=",".join(SYSTEMS), help="systems, comma-separated")
    parser.add_argument("--quick", action="store_true", help="small N: a smoke run")
    parser.add_argument("--new-keys", type=int, default=None, help="figure 1 N (default 2,000)")
    parser.add_argument("--duplicates", type=int, default=None, help="figure 2 N (default 1,000)")
    parser.add_argument("--jobs", type=int, default=None, help="figure 3 N (default 2,000)")
    parser.add_argument("--tries", type=int, default=None, help="figure 4 tries (default 30)")
    parser.add_argument(
        "--figures", default="1234", help="figures to run, e.g. '12' or '34' (default: all)"
    )
    default_oban = ROOT / ".venv-oban" / "bin" / "python"
    parser.add_argument(
        "--oban-python",
        default=str(default_oban) if default_oban.exists() else "",
        help="a Python >= 3.12 with oban and cyclone, when this one cannot import oban "
        "(default: .venv-oban/bin/python if present)",
    )
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG")
    parser.add_argument("--report", action="store_true", help="reprint and redraw peers.json")
    parser.add_argument("--child-oban", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        saved = results.load("peers.json")
        report.print_peers(saved)
        draw(saved)
        return 0
    sizes = Sizes(500, 200, 500, 10) if args.quick else Sizes()
    sizes = Sizes(
        args.new_keys or sizes.new_keys,
        args.duplicates or sizes.duplicates,
        args.jobs or sizes.jobs,
        args.tries or sizes.tries,
    )
    admin = make_url(args.url)
    if args.child_oban:
        print(json.dumps(child_oban(admin, args.figures, sizes, args.first)))
        return 0

    wanted = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = set(wanted) - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems: {sorted(unknown)}; known: {list(SYSTEMS)}")
    order = [n for n in SYSTEMS if n in wanted]
    systems: dict[str, dict[str, Any]] = {n: {"why": {}} for n in order}
    here = []
    oban_python = ""
    for name in order:
        cls = SYSTEMS[name]
        why = cls.missing()
        if name == "oban" and why and args.oban_python:
            oban_python, why = args.oban_python, ""
        elif why:
            systems[name]["why"]["*"] = why
            continue
        if cls.no_dedup:
            systems[name]["why"]["new_per_s"] = systems[name]["why"]["dup_us"] = cls.no_dedup
        if cls.only:
            systems[name]["why"]["*"] = f"reference row, figure {cls.only} only"
        if not oban_python or name != "oban":
            here.append(name)
        systems[name]["dedup"] = cls.dedup or "-"

    started = time.perf_counter()
    found: dict[str, Any] = {
        "meta": results.meta(
            db.show(admin, "server_version"),
            sizes=asdict(sizes),
            versions=versions(order),
            oban_python=oban_python,
        ),
        "order": order,
        "systems": systems,
    }
    print(f"systems {here} here, oban via {oban_python or '-'}; {sizes}", flush=True)
    if "1" in args.figures or "2" in args.figures:
        t0 = time.perf_counter()
        for name, got in fig_submit(admin, here, sizes).items():
            systems[name].update(got)
        print(f"figures 1-2: {time.perf_counter() - t0:.1f} s", flush=True)
    if "3" in args.figures:
        t0 = time.perf_counter()
        for name, got in fig_drain(admin, here, sizes).items():
            systems[name].update(got)
        if oban_python:
            try:
                got = oban_elsewhere(oban_python, admin, "3", sizes)
                found["meta"]["oban_run"] = got.pop("meta")
                systems["oban"].update(got)
            except Exception as exc:
                failed(systems["oban"]["why"], exc)
        print(f"figure 3: {time.perf_counter() - t0:.1f} s", flush=True)
    if "4" in args.figures:
        t0 = time.perf_counter()
        elsewhere = {}
        if oban_python and "*" not in systems["oban"]["why"]:
            elsewhere["oban"] = oban_tries(oban_python, admin, systems["oban"]["why"])
        for name, got in fig_latency(admin, here, sizes, elsewhere).items():
            systems[name].update(got)
        print(f"figure 4: {time.perf_counter() - t0:.1f} s", flush=True)
    found["meta"]["seconds"] = round(time.perf_counter() - started, 1)
    found["meta"]["loadavg_end"] = os.getloadavg()
    found["markdown"] = report.markdown(report.PEER_HEADERS, report.peer_rows(found))
    results.save("peers.json", found)
    report.print_peers(found)
    if not args.no_chart:
        draw(found)
    return 0


def versions(names: Sequence[str]) -> dict[str, str]:
    from importlib import metadata

    got = {"cyclone": cyclone.__version__ if hasattr(cyclone, "__version__") else "?"}
    for name in ["sqlalchemy", "psycopg", *names]:
        try:
            got[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return got


if __name__ == "__main__":
    sys.exit(main())
