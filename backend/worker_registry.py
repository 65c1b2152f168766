"""Which workers are alive, and on what device: each worker refreshes a key in Redis every few
seconds with a short expiry, so a dead worker disappears by itself within WORKER_TTL_SECONDS."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from redis import Redis

WORKER_KEY_PREFIX = "lanner:worker:"
HEARTBEAT_SECONDS = 2.0
WORKER_TTL_SECONDS = 10


def announce_worker(redis: Redis, name: str, device: dict) -> None:
    record = {"name": name, "device": device, "last_seen": datetime.now(timezone.utc).isoformat()}
    redis.set(WORKER_KEY_PREFIX + name, json.dumps(record), ex=WORKER_TTL_SECONDS)


def retire_worker(redis: Redis, name: str) -> None:
    redis.delete(WORKER_KEY_PREFIX + name)


def live_workers(redis: Redis) -> list[dict]:
    keys = sorted(redis.scan_iter(match=WORKER_KEY_PREFIX + "*", count=100))
    records = [json.loads(raw) for raw in redis.mget(keys) if raw] if keys else []
    return sorted(records, key=lambda record: record["name"])


GPU_CLAIM_PREFIX = "lanner:gpu-claim:"


def claim_gpu(redis: Redis, gpu_uuids: list[str], owner: str) -> str | None:
    """Take the first GPU no live worker holds. GPU UUIDs are unique across hosts, so containers that
    each see every GPU of a box (docker-compose replicas) still end up with one GPU each."""
    for uuid in gpu_uuids:
        if redis.set(GPU_CLAIM_PREFIX + uuid, owner, nx=True, ex=WORKER_TTL_SECONDS):
            return uuid
    return None


def keep_gpu_claim(redis: Redis, uuid: str, owner: str) -> None:
    redis.set(GPU_CLAIM_PREFIX + uuid, owner, ex=WORKER_TTL_SECONDS)
