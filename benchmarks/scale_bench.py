"""Scale numbers for several worker hosts on one PostgreSQL and one Redis (issue 28, docs/multi-host.md):

    python benchmarks/scale_bench.py queue  [--jobs 2000 --claimers 8]
        jobs claimed per second by N claimer processes (each a worker's claim loop, claim_next_job,
        with its own connection) from one queue of queued jobs; checks that no job is claimed twice.
    python benchmarks/scale_bench.py fanout [--clients 1,50,100,200,400 --events 200 --rate 20]
        one job's event stream to N WebSocket clients of the real API (uvicorn, PostgreSQL, Redis):
        events each client got (in order, none twice) and the latency from publish to receipt.

Each prints one JSON line per measurement. Needs PostgreSQL (LANNER_TEST_POSTGRES_URL, as the tests)
and Redis (LANNER_TEST_REDIS_URL; the fan-out uses its database, and flushes it).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from queue_helpers import CPU, add_user  # noqa: E402
from support import SYSTEM_REDIS_URL, free_port, fresh_postgres_database, get_json  # noqa: E402


def _claimer(url: str, name: str, start: multiprocessing.Event, results: multiprocessing.Queue) -> None:
    from sqlalchemy import text

    from lanner.core.db import session_factory
    from lanner.core.queue.claim import claim_next_job

    claimed = []
    with session_factory(url)() as session:
        session.execute(text("SELECT 1"))  # connected before the clock starts
        start.wait()
        while (job := claim_next_job(session, name, CPU)) is not None:
            claimed.append(job.id)
    results.put((name, claimed, time.time()))


def queue_bench(jobs: int, claimers: int) -> dict:
    from sqlalchemy import insert, select

    from lanner.core import db
    from lanner.core.models import Job, JobStatus

    with fresh_postgres_database() as url:
        db.migrate(url)
        with db.session_factory(url)() as session:
            owner = add_user(session)
            session.execute(insert(Job), [
                {"owner_id": owner, "name": f"job {i}", "method": "lora", "model": "builtin/SmolLM2-135M-Instruct",
                 "status": JobStatus.queued, "queue_order": float(i), "config": {}} for i in range(jobs)])
            session.commit()
        context = multiprocessing.get_context("spawn")
        start, results = context.Event(), context.Queue()
        processes = [context.Process(target=_claimer, args=(url, f"cpu{n}@bench", start, results))
                     for n in range(claimers)]
        for process in processes:
            process.start()
        time.sleep(3)  # every claimer imported and connected
        started = time.time()
        start.set()
        reports = [results.get(timeout=600) for _ in processes]
        for process in processes:
            process.join()
        finished = max(ended for _, _, ended in reports)
        claimed = [job_id for _, ids, _ in reports for job_id in ids]
        with db.session_factory(url)() as session:
            rows = dict(session.execute(select(Job.id, Job.worker)).all())
        db.get_engine(url).dispose()
    owners = {job_id: name for name, ids, _ in reports for job_id in ids}
    return {"bench": "queue", "jobs": jobs, "claimers": claimers, "claimed": len(claimed),
            "claimed_twice": len(claimed) - len(set(claimed)),
            "rows_on_another_worker": sum(rows[job_id] != name for job_id, name in owners.items()),
            "seconds": round(finished - started, 2), "jobs_per_second": round(len(claimed) / (finished - started), 1),
            "per_claimer": sorted(len(ids) for _, ids, _ in reports)}


async def _client(url: str, cookie: str, events: int, connected: asyncio.Event, ready: list,
                  received: list, deadline: float) -> None:
    import websockets

    got: list[tuple[int, float]] = []
    try:
        async with websockets.connect(url, additional_headers={"Cookie": cookie}, max_queue=None,
                                      open_timeout=60) as socket:
            ready.append(1)
            await connected.wait()
            while len(got) < events and time.time() < deadline:
                try:
                    message = json.loads(await asyncio.wait_for(socket.recv(), max(0.1, deadline - time.time())))
                except asyncio.TimeoutError:
                    break
                if message["type"] == "metric":
                    got.append((message["data"]["seq"], time.time() - message["data"]["t"]))
    except Exception as error:  # a refused or dropped connection counts as events not delivered
        print(f"client: {type(error).__name__}: {error}", file=sys.stderr)
    received.append(got)


async def _fanout_once(ws_url: str, cookie: str, redis, stream: str, clients: int, events: int, rate: float) -> dict:
    from lanner.core.streams import publish

    connected, ready, received = asyncio.Event(), [], []
    deadline = time.time() + 60 + events / rate + 30
    tasks = [asyncio.ensure_future(_client(ws_url, cookie, events, connected, ready, received, deadline))
             for _ in range(clients)]
    while len(ready) < clients and time.time() < deadline - events / rate - 30:
        await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)  # every relay is reading the stream
    connected.set()

    def publisher():
        for seq in range(events):
            publish(redis, stream, "metric", {"seq": seq, "t": time.time()})
            time.sleep(1 / rate)

    await asyncio.to_thread(publisher)
    await asyncio.gather(*tasks)
    complete = sum(1 for got in received if [seq for seq, _ in got] == list(range(events)))
    latencies = sorted(latency for got in received for _, latency in got)
    quantile = (lambda q: round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)
                if latencies else None)
    return {"bench": "fanout", "clients": clients, "connected": len(ready), "events": events, "rate_per_s": rate,
            "complete_clients": complete, "delivered": sum(len(got) for got in received),
            "expected": clients * events, "latency_ms_p50": quantile(0.5), "latency_ms_p99": quantile(0.99),
            "latency_ms_max": round(1000 * latencies[-1], 1) if latencies else None,
            "latency_ms_mean": round(1000 * statistics.fmean(latencies), 1) if latencies else None}


def fanout_bench(client_counts: list[int], events: int, rate: float) -> list[dict]:
    from redis import Redis

    from lanner.backend.security import SESSION_COOKIE, open_session
    from lanner.core import db
    from lanner.core.models import Job
    from lanner.core.streams import job_stream

    redis_url = SYSTEM_REDIS_URL
    redis = Redis.from_url(redis_url, decode_responses=True)
    redis.flushdb()
    results = []
    with fresh_postgres_database() as url, tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        db.migrate(url)
        with db.session_factory(url)() as session:
            owner = add_user(session)
            job = Job(owner_id=owner, name="fan-out", method="lora", model="builtin/SmolLM2-135M-Instruct", config={})
            session.add(job)
            session.commit()
            job_id = job.id
        port = free_port()
        env = {key: value for key, value in os.environ.items() if not key.startswith("LANNER_")}
        env.update(LANNER_DATA_DIR=tmp, LANNER_DATABASE_URL=url, LANNER_REDIS_URL=redis_url, PYTHONUNBUFFERED="1")
        api = subprocess.Popen([sys.executable, "-m", "uvicorn", "lanner.backend.app:create_app", "--factory",
                                "--port", str(port), "--log-level", "warning"], cwd=tmp, env=env,
                               stdin=subprocess.DEVNULL)
        try:
            for _ in range(120):
                try:
                    get_json(f"http://127.0.0.1:{port}/api/health")
                    break
                except Exception:
                    time.sleep(0.5)
            cookie = f"{SESSION_COOKIE}={open_session(redis, owner, days=1)}"
            for clients in client_counts:
                stream = job_stream(job_id)
                redis.delete(stream)
                ws_url = f"ws://127.0.0.1:{port}/ws/jobs/{job_id}?after=$"
                result = asyncio.run(_fanout_once(ws_url, cookie, redis, stream, clients, events, rate))
                print(json.dumps(result), flush=True)
                results.append(result)
        finally:
            api.terminate()
            api.wait(30)
            db.get_engine(url).dispose()
    redis.flushdb()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benches = parser.add_subparsers(dest="bench", required=True)
    queue = benches.add_parser("queue")
    queue.add_argument("--jobs", type=int, default=2000)
    queue.add_argument("--claimers", type=int, default=8)
    fanout = benches.add_parser("fanout")
    fanout.add_argument("--clients", default="1,50,100,200,400", help="comma-separated client counts")
    fanout.add_argument("--events", type=int, default=200)
    fanout.add_argument("--rate", type=float, default=20.0, help="events published per second")
    args = parser.parse_args()
    if args.bench == "queue":
        print(json.dumps(queue_bench(args.jobs, args.claimers)), flush=True)
    else:
        fanout_bench([int(count) for count in args.clients.split(",")], args.events, args.rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
