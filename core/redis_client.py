"""One Redis client per URL, with short timeouts so a health check never hangs on a dead server."""
from __future__ import annotations

from functools import lru_cache

from redis import Redis


@lru_cache
def get_redis(url: str) -> Redis:
    return Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5, decode_responses=True)
