"""Live streams over WebSocket: /ws/jobs/{id}, /ws/queue, /ws/hardware. Each replays its Redis
Stream after `?after=<event id>` (everything with 0-0, only new events with $ or when left out for
the shared streams), then sends live events as they come, one JSON message each:
{"id": "<stream id>", "type": …, "data": …}. A client that reconnects with the last id it saw gets
the gap in order and nothing twice. A job's events are the training record's
(lanner.core.messages.records: JobEventType names the types), relayed as their publisher wrote them."""
from __future__ import annotations

import asyncio
import json
import logging
import re
import time

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from redis.asyncio import Redis as AsyncRedis
from redis.exceptions import RedisError

from lanner.core import db
from lanner.backend.deps import WS_BAD_REQUEST, WS_NOT_FOUND, WS_UNAUTHORISED, websocket_user
from lanner.backend.schemas.common import MAX_ID
from lanner.core.models import Job
from lanner.core.redis_client import get_redis
from lanner.core.settings import get_settings
from lanner.core.streams import HARDWARE_STREAM, QUEUE_STREAM, job_stream

router = APIRouter(tags=["live"])
log = logging.getLogger(__name__)
STREAM_ID = re.compile(r"^(\d+(-\d+)?|\$)$")
BLOCK_MS = 1000
BATCH = 500
# How often an open socket asks again whether its user is still signed in (signed out, deactivated,
# password changed): the stream stops within this many seconds.
SESSION_RECHECK_S = 2.0
REDIS_RETRY_S = 1.0


def _signed_in(websocket: WebSocket) -> bool:
    settings = get_settings()
    with db.session_factory(settings.database_url)() as session:
        return websocket_user(websocket, session, get_redis(settings.redis_url)) is not None


def _job_exists(job_id: int) -> bool:
    if not 1 <= job_id <= MAX_ID:  # no such row, and a database would refuse to compare with it
        return False
    with db.session_factory(get_settings().database_url)() as session:
        return session.get(Job, job_id) is not None


async def _until_disconnect(websocket: WebSocket) -> None:
    while (await websocket.receive())["type"] != "websocket.disconnect":
        pass  # clients have nothing to say on these streams; whatever they send is ignored


async def _relay(websocket: WebSocket, stream: str, after: str) -> None:
    redis = AsyncRedis.from_url(get_settings().redis_url, decode_responses=True, socket_connect_timeout=2)
    # Reading the client's side at the same time is how a disconnect is noticed between events.
    closed = asyncio.ensure_future(_until_disconnect(websocket))
    checked_at = time.monotonic()
    try:
        while not closed.done():
            try:
                if time.monotonic() - checked_at >= SESSION_RECHECK_S:
                    if not await asyncio.to_thread(_signed_in, websocket):
                        await websocket.close(WS_UNAUTHORISED, "The session ended: sign in again")
                        return
                    checked_at = time.monotonic()
                answer = await redis.xread({stream: after}, count=BATCH, block=BLOCK_MS)
            except RedisError:  # Redis restarting: the socket stays open and reads on after `after`
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            for _, entries in answer or []:
                for event_id, fields in entries:
                    # data is JSON already, as the publisher wrote it: passed on without a re-parse
                    await websocket.send_text(
                        f'{{"id": {json.dumps(event_id)}, "type": {json.dumps(fields["type"])}, "data": {fields["data"]}}}')
                    after = event_id
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        closed.cancel()
        await redis.aclose()


def _starting_id(websocket: WebSocket, stream: str, default_after: str) -> str | None:
    """The id to read after; "$" (only new events) is pinned to the stream's last id now, before
    the handshake completes, so an event published as soon as the client is connected is not lost."""
    after = websocket.query_params.get("after") or default_after
    if not STREAM_ID.match(after):
        return None
    if after == "$":
        redis = get_redis(get_settings().redis_url)
        after = redis.xinfo_stream(stream)["last-generated-id"] if redis.exists(stream) else "0-0"
    return after


async def _start(websocket: WebSocket, stream: str, default_after: str) -> str | None:
    """Accepts, then checks the user and the `after` id; closes with a reason code on failure."""
    after = await asyncio.to_thread(_starting_id, websocket, stream, default_after)
    await websocket.accept()
    if not await asyncio.to_thread(_signed_in, websocket):
        await websocket.close(WS_UNAUTHORISED, "Sign in first (session cookie or ?token=<API token>)")
        return None
    if after is None:
        await websocket.close(WS_BAD_REQUEST, "after must be a stream id like 1700000000000-0, 0-0 or $")
    return after


@router.websocket("/ws/jobs/{job_id}")
async def job_events(websocket: WebSocket, job_id: int) -> None:
    """Metrics, device samples, logs and status changes of one job, from the start by default."""
    after = await _start(websocket, job_stream(job_id), "0-0")
    if after is None:
        return
    if not await asyncio.to_thread(_job_exists, job_id):
        await websocket.close(WS_NOT_FOUND, f"No job {job_id}")
        return
    await _relay(websocket, job_stream(job_id), after)


@router.websocket("/ws/queue")
async def queue_events(websocket: WebSocket) -> None:
    """Jobs added, started, finished, reordered, cancelled, deleted; only new ones by default."""
    after = await _start(websocket, QUEUE_STREAM, "$")
    if after is not None:
        await _relay(websocket, QUEUE_STREAM, after)


@router.websocket("/ws/hardware")
async def hardware_events(websocket: WebSocket) -> None:
    """Each worker's device telemetry; only new samples by default."""
    after = await _start(websocket, HARDWARE_STREAM, "$")
    if after is not None:
        await _relay(websocket, HARDWARE_STREAM, after)
