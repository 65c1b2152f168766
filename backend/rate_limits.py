"""Rate limits: a token bucket per user (per client address before sign-in) and per kind of request,
kept in Redis so every API process counts together. GCRA in one Lua script: a burst of up to the
limit, then one request every 60/limit seconds; a refused request costs nothing and is told how
long to wait (429 with Retry-After). Redis's clock is the only clock, so API hosts need not agree.
When Redis cannot be reached the request goes through: a limit is a guard, not a dependency."""
from __future__ import annotations

import logging
import math

from fastapi import HTTPException
from redis import Redis, RedisError

log = logging.getLogger(__name__)
PREFIX = "lanner:rate:"
_GCRA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local wait = tat + interval - burst * interval - now
if wait > 0 then return wait end
tat = tat + interval
redis.call('SET', KEYS[1], tat, 'PX', tat - now + 1000)
return 0
"""


def charge(redis: Redis, bucket: str, who: str, per_minute: int) -> None:
    """Counts one request of `who` against `bucket`; 429 when its bucket is empty."""
    interval_ms = math.ceil(60_000 / per_minute)
    try:
        wait_ms = int(redis.eval(_GCRA, 1, f"{PREFIX}{bucket}:{who}", interval_ms, per_minute))
    except RedisError:
        log.warning("rate limit %s not checked: Redis unreachable", bucket, exc_info=True)
        return
    if wait_ms > 0:
        wait = max(1, math.ceil(wait_ms / 1000))
        raise HTTPException(429, f"Too many requests ({bucket}: at most {per_minute} a minute); try again in {wait} s",
                            headers={"Retry-After": str(wait)})
