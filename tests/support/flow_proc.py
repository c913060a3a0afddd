"""A worker process for the flow-control tests: ``python -m tests.support.flow_proc NAME SPEC``.

``kinds(NAME, SPEC)`` defines the step kinds of one test by name, so the test process
enqueues with the same definitions its children serve. SPEC is JSON:
``{"limit": "concurrency" | "rate" | "shared" | "paired" | "workflow" | "steps", "max": N,
"rate": N,
"per": seconds, "concurrency": C, "on_limit": ..., "name": limit name}`` ("workflow":
serve :func:`workflow` instead; "steps": serve :func:`step_workflows`; "map": serve
:func:`map_workflow`).
A job's args are ``{"k": key, "ms": how long its step runs, "block": path or null}``: a
step given ``block`` creates that file and then blocks forever (the test kills it).
The worker serves until SIGTERM; the database URL comes from ``CYCLONE_TEST_DATABASE_URL``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import cyclone

HEARTBEAT = timedelta(milliseconds=200)
RESCUE_AFTER = timedelta(seconds=1)


def _work(ctx: cyclone.StepContext, args: dict[str, Any]) -> None:
    block = args.get("block")
    if block and not Path(block).exists():  # its first attempt only
        Path(block).touch()
        while True:
            time.sleep(3600)  # the step under test never ends; the test kills its process
    time.sleep(args.get("ms", 0) / 1000)


def _key(args: dict[str, Any]) -> str:
    return str(args["k"])


def kinds(name: str, spec: dict[str, Any]) -> list[cyclone.StandaloneStep[Any, Any]]:
    """The step kinds of test ``name`` (see the module docstring)."""
    limit = spec["limit"]
    if limit == "concurrency":
        conc = cyclone.Concurrency(spec["max"], key=_key, name=spec.get("name"))
        return [cyclone.step(name, concurrency=conc)(_work)]
    if limit == "rate":
        rate = cyclone.Rate(spec["max"], timedelta(seconds=spec["per"]), key=_key)
        return [cyclone.step(name, rate=rate)(_work)]
    if limit == "shared":
        shared = f"{name}-shared"
        return [
            cyclone.step(
                f"{name}.{part}",
                concurrency=cyclone.Concurrency(spec["max"], key=_key, name=shared),
            )(_work)
            for part in ("a", "b")
        ]
    if limit == "paired":
        # A kind with a Concurrency and a Rate, and a kind sharing that Rate alone.
        rate = cyclone.Rate(spec["rate"], timedelta(seconds=spec["per"]), name=f"{name}-rate")
        conc = cyclone.Concurrency(spec["max"], key=_key)
        return [
            cyclone.step(f"{name}.paired", concurrency=conc, rate=rate)(_work),
            cyclone.step(f"{name}.alone", rate=rate)(_work),
        ]
    raise ValueError(limit)


def workflow(name: str, spec: dict[str, Any]) -> cyclone.Workflow[Any]:
    """The workflow of test ``name``: its runs in progress limited per ``input["k"]`` to
    ``spec["max"]`` (``on_limit`` from the spec); two steps of ``input["ms"]`` each."""
    conc = cyclone.Concurrency(spec["max"], key=_key, on_limit=spec.get("on_limit", "queue"))
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name, concurrency=conc)

    @wf.step()
    def first(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        _work(ctx, value)

    @wf.step(after=[first])
    def second(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
        time.sleep(value.get("ms", 0) / 1000)

    return wf


def step_workflows(name: str, spec: dict[str, Any]) -> list[cyclone.Workflow[Any]]:
    """The workflows of test ``name`` whose step ``limited`` has a Concurrency of
    ``spec["max"]`` per ``input["k"]`` (shared by ``spec["name"]`` when given, else its
    own), then an unlimited step ``after``; ``spec["workflows"]`` of them (default 1),
    named ``name``, ``name.2``, ..."""
    made = []
    for i in range(spec.get("workflows", 1)):
        wf: cyclone.Workflow[Any] = cyclone.Workflow(name if i == 0 else f"{name}.{i + 1}")
        conc = cyclone.Concurrency(spec["max"], key=_key, name=spec.get("name"))

        @wf.step(concurrency=conc)
        def limited(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
            _work(ctx, value)

        @wf.step(after=[limited])
        def after(ctx: cyclone.StepContext, value: dict[str, Any]) -> None:
            time.sleep(value.get("ms", 0) / 1000)

        made.append(wf)
    return made


def map_workflow(name: str, spec: dict[str, Any]) -> cyclone.ResultWorkflow[Any, Any]:
    """The workflow of test ``name`` whose map node ``each`` runs ``input["n"]`` items of
    ``input["ms"]`` each, at most ``spec["max"]`` items at once per ``input["k"]`` (a
    ``Concurrency``); its result is the items' outputs (their indexes)."""
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name)

    @wf.step()
    def items(ctx: cyclone.StepContext, value: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"i": i, "ms": value["ms"]} for i in range(value["n"])]

    @wf.map(over=items, result=True, concurrency=cyclone.Concurrency(spec["max"], key=_key))
    def each(ctx: cyclone.StepContext, item: dict[str, Any]) -> int:
        time.sleep(item["ms"] / 1000)
        return int(item["i"])

    return wf


def main() -> None:
    name, spec_text = sys.argv[1], sys.argv[2]
    spec = json.loads(spec_text)
    engine = sa.create_engine(os.environ["CYCLONE_TEST_DATABASE_URL"], pool_size=4)
    served: dict[str, Any]
    if spec["limit"] == "workflow":
        served = {"workflows": [workflow(name, spec)]}
    elif spec["limit"] == "map":
        served = {"workflows": [map_workflow(name, spec)]}
    elif spec["limit"] == "steps":
        served = {"workflows": step_workflows(name, spec)}
    else:
        served = {"steps": kinds(name, spec)}
    worker = cyclone.Worker(
        engine,
        **served,
        concurrency=spec.get("concurrency", 4),
        poll_interval=0.2,
        heartbeat_interval=HEARTBEAT,
        rescue_after=RESCUE_AFTER,
        sweep=False,
    )
    print(json.dumps({"pid": os.getpid()}), flush=True)
    worker.run(grace=5)


if __name__ == "__main__":
    main()
