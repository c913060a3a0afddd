"""The asyncio peers: PgQueuer (on asyncpg), Chancy and oban."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any, ClassVar

from bench import workloads
from bench.systems.system import POLL, AsyncSystem, imp, key

OBAN_QUEUE_LIMIT = 10  # oban has no default queue: the limit of its documentation's examples


class PgQueuer(AsyncSystem):
    name = "pgqueuer"
    module = "pgqueuer,asyncpg"
    dedup = "Queries.enqueue(entrypoint, payload, dedupe_key=key); DuplicateJobError on a duplicate"
    count_sql = "SELECT count(*) FROM pgqueuer"
    done_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"

    async def _connect(self) -> tuple[Any, Any]:
        # asyncpg, the driver of PgQueuer's quickstart: with its psycopg driver the
        # listener holds the one connection and every query waited ~1 s behind it here.
        conn = await imp("asyncpg").connect(self.dsn)
        driver = imp("pgqueuer.db").AsyncpgDriver(conn)
        return conn, driver

    async def ainstall(self) -> None:
        conn, driver = await self._connect()
        await imp("pgqueuer.queries").Queries(driver).install()
        await conn.close()

    async def aopen(self) -> None:
        self.conn, driver = await self._connect()
        self.queries = imp("pgqueuer.queries").Queries(driver)
        self.duplicate = imp("pgqueuer.errors").DuplicateJobError

    async def aclose(self) -> None:
        await self.conn.close()

    async def anew(self, idx: range) -> None:
        for i in idx:
            body = json.dumps(workloads.payload(i)).encode()
            await self.queries.enqueue("bench_noop", body, dedupe_key=key(i))

    async def adup(self, idx: range) -> None:
        for i in idx:
            body = json.dumps(workloads.payload(i)).encode()
            try:
                await self.queries.enqueue("bench_noop", body, dedupe_key=key(i))
            except self.duplicate:
                continue
            raise AssertionError("pgqueuer accepted a duplicate dedupe_key")

    async def apreload(self, n: int) -> None:
        for i in range(n):
            await self.queries.enqueue("bench_noop", str(i).encode())

    async def aping(self, i: int) -> float:
        t0 = time.perf_counter()
        (job_id,) = await self.queries.enqueue("bench_noop", str(i).encode())
        while True:
            got = await self.queries.job_status([job_id])
            if got and got[0][1] == "successful":
                break
            await asyncio.sleep(POLL)
        return time.perf_counter() - t0

    async def _pgq(self) -> tuple[Any, Any]:
        conn, driver = await self._connect()
        pgq = imp("pgqueuer").PgQueuer(driver)
        pgq.entrypoint("bench_noop")(workloads.pgqueuer_noop)
        return conn, pgq

    async def adrain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        conn, pgq = await self._pgq()
        ready()
        t0 = time.monotonic()
        await pgq.run(mode=imp("pgqueuer.types").QueueExecutionMode.drain)
        t1 = time.monotonic()
        await conn.close()
        return t0, t1, n - self.sql("SELECT count(*) FROM pgqueuer")  # done jobs leave it

    async def aserve(self) -> None:
        _conn, pgq = await self._pgq()
        await pgq.run()


class Chancy(AsyncSystem):
    name = "chancy"
    module = "chancy"
    dedup = "Chancy.push(Job.from_func(f).with_unique_key(key)); returns the holder's reference"
    count_sql = "SELECT count(*) FROM chancy_jobs"
    done_sql = "SELECT count(*) FROM chancy_jobs WHERE state = 'succeeded'"

    def _job(self, **kwargs: Any) -> Any:
        return imp("chancy").Job.from_func(workloads.chancy_noop).with_kwargs(**kwargs)

    queue_options: ClassVar[dict[str, Any]] = {}

    async def ainstall(self) -> None:
        chancy = imp("chancy")
        async with chancy.Chancy(self.dsn) as app:
            await app.migrate()
            await app.declare(chancy.Queue("default", **self.queue_options))

    async def aopen(self) -> None:
        self.app = imp("chancy").Chancy(self.dsn)
        await self.app.__aenter__()

    async def aclose(self) -> None:
        await self.app.__aexit__(None, None, None)

    async def anew(self, idx: range) -> None:
        for i in idx:
            await self.app.push(self._job(**workloads.payload(i)).with_unique_key(key(i)))

    async def adup(self, idx: range) -> None:
        for i in idx:
            await self.app.push(self._job(**workloads.payload(i)).with_unique_key(key(i)))

    async def apreload(self, n: int) -> None:
        for i in range(n):
            await self.app.push(self._job(value=i))

    async def aping(self, i: int) -> float:
        t0 = time.perf_counter()
        ref = await self.app.push(self._job(value=i))
        job = await self.app.wait_for_job(ref, interval=POLL)
        elapsed = time.perf_counter() - t0
        assert job is not None
        assert job.state == job.State.SUCCEEDED
        return elapsed

    async def adrain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        chancy = imp("chancy")
        async with chancy.Chancy(self.dsn) as app:
            worker = chancy.Worker(app)
            ready()
            t0 = time.monotonic()
            await worker.start()
            done = await self.await_done(n)
            t1 = time.monotonic()
            await worker.stop()
        return t0, t1, done

    async def aserve(self) -> None:
        chancy = imp("chancy")
        async with chancy.Chancy(self.dsn) as app, chancy.Worker(app) as worker:
            await worker.wait_for_shutdown()


class ChancyEager(Chancy):
    """Reference row: Chancy's queue option for continuously available jobs."""

    name = "chancy-eager"
    only = "3"
    queue_options: ClassVar[dict[str, Any]] = {"eager_polling": True}


class Oban(AsyncSystem):
    name = "oban"
    module = "oban"
    no_dedup = "unique jobs are an Oban Pro (paid) feature; open-source oban has none"
    count_sql = "SELECT count(*) FROM oban_jobs"
    done_sql = "SELECT count(*) FROM oban_jobs WHERE state = 'completed'"

    def _worker(self) -> Any:
        return imp("oban").job(queue="default")(workloads.oban_noop)

    async def ainstall(self) -> None:
        oban = imp("oban")
        pool = await oban.Oban.create_pool(self.dsn)
        await imp("oban.schema").install(pool)
        await pool.close()

    async def aopen(self) -> None:
        oban = imp("oban")
        self.pool = await oban.Oban.create_pool(self.dsn)
        self.oban = oban.Oban(pool=self.pool)  # client mode: no queues
        await self.oban.start()
        self.noop = self._worker()

    async def aclose(self) -> None:
        await self.oban.stop()
        await self.pool.close()

    async def apreload(self, n: int) -> None:
        for i in range(n):
            await self.oban.enqueue(self.noop.new(value=i))

    async def aping(self, i: int) -> float:
        t0 = time.perf_counter()
        job = await self.oban.enqueue(self.noop.new(value=i))
        while True:
            got = await self.oban.get_job(job.id)
            if got is not None and str(getattr(got.state, "value", got.state)) == "completed":
                break
            await asyncio.sleep(POLL)
        return time.perf_counter() - t0

    async def _server(self) -> tuple[Any, Any]:
        oban = imp("oban")
        pool = await oban.Oban.create_pool(self.dsn)
        self._worker()
        return pool, oban.Oban(pool=pool, queues={"default": OBAN_QUEUE_LIMIT})

    async def adrain(self, n: int, ready: Callable[[], None]) -> tuple[float, float, int]:
        pool, server = await self._server()
        ready()
        t0 = time.monotonic()
        await server.start()
        done = await self.await_done(n)
        t1 = time.monotonic()
        await server.stop()
        await pool.close()
        return t0, t1, done

    async def aserve(self) -> None:
        _pool, server = await self._server()
        await server.start()
        await asyncio.Event().wait()
