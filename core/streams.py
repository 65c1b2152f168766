"""Redis Streams that carry live events. One stream per job (the training record's events:
lanner.core.messages.records), one for the queue and one for hardware telemetry. Each entry is
{"type": …, "data": JSON}; readers resume after the last id they saw, so a reconnecting browser
misses nothing."""
from __future__ import annotations

import json
from typing import Any

from redis import Redis

JOB_STREAM_MAXLEN = 200_000
QUEUE_STREAM = "lanner:queue:events"
HARDWARE_STREAM = "lanner:hardware:events"
SHARED_STREAM_MAXLEN = 10_000


def job_stream(job_id: int) -> str:
    return f"lanner:job:{job_id}:events"


def publish(redis: Redis, stream: str, event_type: str, data: dict[str, Any], maxlen: int = JOB_STREAM_MAXLEN) -> str:
    """Append one event; returns its id. The stream is trimmed approximately to maxlen entries."""
    return redis.xadd(stream, {"type": event_type, "data": json.dumps(data)}, maxlen=maxlen, approximate=True)


def read_after(redis: Redis, stream: str, after_id: str = "0-0", count: int = 1000,
               block_ms: int | None = None) -> list[tuple[str, str, dict[str, Any]]]:
    """Events strictly after `after_id`, oldest first, as (id, type, data)."""
    answer = redis.xread({stream: after_id}, count=count, block=block_ms)
    if not answer:
        return []
    return [(event_id, fields["type"], json.loads(fields["data"])) for event_id, fields in answer[0][1]]
