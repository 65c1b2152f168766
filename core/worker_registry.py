"""Which workers are alive, on what device, and which devices a job holds.

Each worker refreshes a key in Redis every few seconds with a short expiry, so a dead worker
disappears by itself within WORKER_TTL_SECONDS. A job holds its devices through reservation keys
(`lanner:device:<device id>:reserved`, the holding worker's name as value) with the same expiry,
refreshed while the job runs: a worker that dies mid-job frees its devices by itself too.
"""
from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone

from redis import Redis

from lanner.core.messages.device import Device, WorkerRecord

WORKER_KEY_PREFIX = "lanner:worker:"
HEARTBEAT_SECONDS = 2.0
WORKER_TTL_SECONDS = 10
EXIT_NAME_TAKEN = 78  # EX_CONFIG: a live worker holds this worker's name (take_worker_name)


def announce_worker(redis: Redis, name: str, device: Device, instance: str | None = None,
                    first: bool = False) -> bool:
    """Writes this worker's record with a fresh expiry. With `first`, only while no record of that
    name is live (the start of a worker); returns whether it wrote."""
    record = WorkerRecord(name=name, device=device, last_seen=datetime.now(timezone.utc).isoformat(),
                          host=device.host, instance=instance)
    return bool(redis.set(WORKER_KEY_PREFIX + name, record.model_dump_json(exclude={"reserved_by"}),
                          ex=WORKER_TTL_SECONDS, nx=first))


def duplicate_name_message(name: str, holder: WorkerRecord | None) -> str:
    where = f" on host {holder.host}" if holder and holder.host else ""
    return (f"A worker named {name} is already running{where}: two hosts share the name "
            f"{name.split('@', 1)[-1]!r}. Give each host its own LANNER_HOST_NAME (or each worker its own --name).")


def take_worker_name(redis: Redis, name: str, device: Device, instance: str) -> str | None:
    """Announces a starting worker under `name`. A record of that name left by a previous life of the
    worker (killed, then started again) expires within WORKER_TTL_SECONDS, so this waits that long for
    it; a live worker of that name keeps its record fresh. Returns None once announced, else why not."""
    deadline = time.monotonic() + WORKER_TTL_SECONDS + HEARTBEAT_SECONDS
    while not announce_worker(redis, name, device, instance, first=True):
        if time.monotonic() > deadline:
            raw = redis.get(WORKER_KEY_PREFIX + name)
            return duplicate_name_message(name, WorkerRecord.model_validate_json(raw) if raw else None)
        time.sleep(0.5)
    return None


def retire_worker(redis: Redis, name: str) -> None:
    redis.delete(WORKER_KEY_PREFIX + name)


def live_workers(redis: Redis) -> list[WorkerRecord]:
    """Every live worker's record, by host then name, each with `reserved_by`: the worker whose job holds its device
    (itself while it runs a job, another worker while it lends the device to a multi-GPU job)."""
    keys = sorted(redis.scan_iter(match=WORKER_KEY_PREFIX + "*", count=100))
    records = [WorkerRecord.model_validate_json(raw) for raw in redis.mget(keys) if raw] if keys else []
    holders = device_holders(redis, [record.device.id for record in records])
    for record in records:
        record.reserved_by = holders.get(record.device.id)
    return sorted(records, key=lambda record: (record.host or "", record.name))  # grouped by host


def largest_machine(records: list[WorkerRecord]) -> int:
    """How many live workers' devices the best-equipped machine has, counting devices of one kind on
    one machine (what a job on several devices may use). 0 when no worker is live."""
    machines = Counter((record.device.kind, record.device.machine_name) for record in records)
    return max(machines.values(), default=0)


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


def reservation_key(device_id: str) -> str:
    return f"lanner:device:{device_id}:reserved"


# All or nothing, in one step on the Redis server: two workers reserving overlapping sets never both
# succeed, and neither is left holding half of what it asked for. Taking again what the holder already
# holds succeeds (its own device, reserved before it looks at the queue).
_RESERVE = """
for i, key in ipairs(KEYS) do
  local holder = redis.call('GET', key)
  if holder and holder ~= ARGV[1] then return 0 end
end
for i, key in ipairs(KEYS) do redis.call('SET', key, ARGV[1], 'EX', ARGV[2]) end
return 1
"""
_KEEP = """
local kept = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('EXPIRE', key, ARGV[2]); kept = kept + 1 end
end
return kept
"""
_RELEASE = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then redis.call('DEL', key) end
end
return 1
"""


def reserve_devices(redis: Redis, device_ids: list[str], holder: str) -> bool:
    """Reserve every device in device_ids for `holder`, or none of them. Returns whether it did."""
    keys = [reservation_key(device_id) for device_id in device_ids]
    return bool(redis.eval(_RESERVE, len(keys), *keys, holder, WORKER_TTL_SECONDS))


def keep_devices(redis: Redis, device_ids: list[str], holder: str) -> int:
    """Refresh the expiry of the reservations `holder` still holds; returns how many it holds."""
    keys = [reservation_key(device_id) for device_id in device_ids]
    return int(redis.eval(_KEEP, len(keys), *keys, holder, WORKER_TTL_SECONDS))


def release_devices(redis: Redis, device_ids: list[str], holder: str) -> None:
    """Free the reservations `holder` holds among device_ids (never another holder's)."""
    keys = [reservation_key(device_id) for device_id in device_ids]
    if keys:
        redis.eval(_RELEASE, len(keys), *keys, holder)


def device_holders(redis: Redis, device_ids: list[str | None]) -> dict[str, str]:
    """device id -> the worker holding it, for the reserved ones among device_ids."""
    ids = [device_id for device_id in device_ids if device_id]
    if not ids:
        return {}
    holders = redis.mget([reservation_key(device_id) for device_id in ids])
    return {device_id: holder for device_id, holder in zip(ids, holders) if holder}
