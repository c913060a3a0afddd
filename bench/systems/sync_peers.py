"""The peers driven synchronously: Procrastinate (its sync connector) and DBOS."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import workloads
from bench.systems.system import POLL, System, imp, key


class Procrastinate(System):
    name = "procrastinate"
    module = "procrastinate"
    dedup = "task.configure(queueing_lock=key).defer(**input); AlreadyEnqueued on a duplicate"
    count_sql = "SELECT count(*) FROM procrastinate_jobs"
    done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    def _app(self, *, sync: bool) -> tuple[Any, Any]:
        p = imp("procrastinate")
        connector = (
            p.SyncPsycopgConnector(conninfo=self.dsn)
            if sync
            else p.PsycopgConnector(conninfo=self.dsn)
        )
        app = p.App(connector=connector)
        task = app.task(name="bench_noop")(workloads.procrastinate_noop)
        return app, task

    def install(self) -> None:
        app, _task = self._app(sync=True)
        with app.open():
            app.schema_manager.apply_schema()

    def open(self) -> None:
        self.app, self.task = self._app(sync=True)
        self.app.open()
        self.already = imp("procrastinate.exceptions").AlreadyEnqueued
        self.succeeded = imp("procrastinate.jobs").Status.SUCCEEDED

    def close(self) -> None:
        self.app.close()

    def new(self, idx: range) -> None:
        for i in idx:
            self.task.configure(queueing_lock=key(i)).defer(**workloads.payload(i))

    def dup(self, idx: range) -> None:
        for i in idx:
            try:
                self.task.configure(queueing_lock=key(i)).defer(**workloads.payload(i))
            except self.already:
                continue
            raise AssertionError("procrastinate accepted a duplicate queueing_lock")

    def preload(self, n: int) -> None:
        for i in range(n):
            self.task.defer(value=i)

    def ping(self, i: int) -> float:
        t0 = time.perf_counter()
        job_id = self.task.defer(value=i)
        while self.app.job_manager.get_job_status(job_id) != self.succeeded:
            time.sleep(POLL)
        return time.perf_counter() - t0

    def drain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        app, _task = self._app(sync=False)
        ready()
        t0 = time.monotonic()
        app.run_worker(wait=False)  # defaults otherwise; returns once the queue is empty
        t1 = time.monotonic()
        return t0, t1, self.sql(self.done_sql)

    def serve(self) -> None:
        app, _task = self._app(sync=False)
        app.run_worker()


class Dbos(System):
    name = "dbos"
    module = "dbos"
    dedup = (
        "DBOSClient.enqueue({workflow_id: key, ...}, input); "
        "a used ID returns the existing workflow's handle"
    )
    count_sql = "SELECT count(*) FROM dbos.workflow_status"
    done_sql = "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
    queue = "bench"

    def _options(self, workflow_id: str) -> dict[str, str]:
        return {"queue_name": self.queue, "workflow_name": "bench_noop", "workflow_id": workflow_id}

    def install(self) -> None:
        exe = Path(sys.executable).parent / "dbos"
        cmd = str(exe) if exe.exists() else (shutil.which("dbos") or "dbos")
        subprocess.run([cmd, "migrate", "-s", self.dsn], check=True, capture_output=True)

    def open(self) -> None:
        self.client = imp("dbos").DBOSClient(system_database_url=self.dsn)

    def close(self) -> None:
        self.client.destroy()

    def new(self, idx: range) -> None:
        for i in idx:
            handle = self.client.enqueue(self._options(key(i)), workloads.payload(i))
            assert handle.workflow_id == key(i)

    def dup(self, idx: range) -> None:
        for i in idx:
            handle = self.client.enqueue(self._options(key(i)), workloads.payload(i))
            assert handle.workflow_id == key(i)

    def preload(self, n: int) -> None:
        for i in range(n):
            self.client.enqueue(self._options(f"job-{i}"), i)

    def ping(self, i: int) -> float:
        t0 = time.perf_counter()
        handle = self.client.enqueue(self._options(f"ping-{i}"), i)
        handle.get_result(polling_interval_sec=POLL)
        return time.perf_counter() - t0

    def _launchable(self) -> Any:
        dbos = imp("dbos")
        dbos.DBOS(config={"name": "cyclone-bench", "system_database_url": self.dsn})
        dbos.DBOS.workflow(name="bench_noop")(workloads.dbos_noop)
        return dbos.DBOS

    def drain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        dbos = self._launchable()
        ready()
        t0 = time.monotonic()
        dbos.launch()
        dbos.register_queue(self.queue)  # defaults: no limits, polled every second
        done = self.wait_done(n)
        t1 = time.monotonic()
        dbos.destroy()
        return t0, t1, done

    def serve(self) -> None:
        dbos = self._launchable()
        dbos.launch()
        dbos.register_queue(self.queue)
        while True:
            time.sleep(3600)
