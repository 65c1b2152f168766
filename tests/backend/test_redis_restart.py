"""A Redis restart (issue 24): an open stream waits for it and goes on, and while it is away the API
answers in words. On a Redis of the test's own, started and stopped here."""
from __future__ import annotations

import pytest
from starlette.websockets import WebSocketDisconnect

from lanner.backend.errors import REDIS_AWAY, TRY_AGAIN_LATER
from lanner.cli.redis_server import start_local_redis
from lanner.core.redis_client import get_redis
from lanner.core.streams import QUEUE_STREAM, publish

from support import free_port

pytestmark = pytest.mark.timeout(60)


def test_an_open_stream_survives_a_redis_restart(team_with, tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    start = lambda: start_local_redis(url, tmp_path / "redis", tmp_path / "redis.log")  # noqa: E731
    server = start()
    try:
        team = team_with(LANNER_REDIS_URL=url)
        with team.alice.websocket_connect("/ws/queue") as socket:
            publish(get_redis(url), QUEUE_STREAM, "added", {"job_id": 1})
            assert socket.receive_json()["data"] == {"job_id": 1}
            server.terminate()
            server.wait(10)
            away = team.bob.get("/api/me")
            assert away.status_code == 503 and away.json()["detail"] == REDIS_AWAY
            with pytest.raises(WebSocketDisconnect) as refused:
                with team.bob.websocket_connect("/ws/queue") as other:
                    other.receive_json()
            assert refused.value.code == TRY_AGAIN_LATER
            server = start()  # its snapshot keeps the sessions, as `lanner up`'s Redis does
            publish(get_redis(url), QUEUE_STREAM, "added", {"job_id": 2})
            assert socket.receive_json()["data"] == {"job_id": 2}
    finally:
        server.terminate()
        server.wait(10)
