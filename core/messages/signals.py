"""Job signals, from the API to the worker that runs the job, through Redis.

Cancel: the API sets the job's flag; the worker polls it, stops the job's process (SIGTERM, whose
handler makes the trainer save a checkpoint and stop at the next step) and clears it when the job ends.
The flag expires on its own, so a job whose worker vanished leaves no key behind for ever.
"""
from __future__ import annotations

from redis import Redis

CANCEL_FLAG_SECONDS = 7 * 86400


def cancel_key(job_id: int) -> str:
    return f"lanner:job:{job_id}:cancel"


def request_cancel(redis: Redis, job_id: int) -> None:
    redis.set(cancel_key(job_id), "1", ex=CANCEL_FLAG_SECONDS)


def cancel_requested(redis: Redis, job_id: int) -> bool:
    return bool(redis.exists(cancel_key(job_id)))


def clear_cancel(redis: Redis, job_id: int) -> None:
    redis.delete(cancel_key(job_id))
