"""Job events on a real Redis Stream: in order, replayable after any id, nothing missed."""
from __future__ import annotations

import uuid

from redis import Redis

from lanner.core.streams import publish, read_after

from support import SYSTEM_REDIS_URL


def test_events_replay_after_the_last_seen_id():
    redis = Redis.from_url(SYSTEM_REDIS_URL, decode_responses=True)
    stream = f"lanner:test:{uuid.uuid4().hex}"
    try:
        ids = [publish(redis, stream, "metric", {"step": step, "loss": 2.0 / (step + 1)}) for step in range(5)]
        everything = read_after(redis, stream)
        assert [data["step"] for _, _, data in everything] == [0, 1, 2, 3, 4]
        assert [event_type for _, event_type, _ in everything] == ["metric"] * 5
        gap = read_after(redis, stream, after_id=ids[1])
        assert [event_id for event_id, _, _ in gap] == ids[2:]
        assert read_after(redis, stream, after_id=ids[-1]) == []
    finally:
        redis.delete(stream)
