"""WebSocket streams: replay after the last seen id, then live events; nothing missed, nothing twice."""
from __future__ import annotations

import pytest
from starlette.websockets import WebSocketDisconnect

from lanner.core.streams import HARDWARE_STREAM, QUEUE_STREAM, job_stream, publish

from backend_helpers import CHAT_ROWS, upload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def job_id(team, wakes):
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    return team.alice.post("/api/jobs", json={"method": "lora", "model": "builtin/SmolLM2-135M-Instruct",
                                              "dataset_id": dataset_id}).json()["id"]


def metric(redis, job, step):
    return publish(redis, job_stream(job), "metric", {"step": step, "loss": 1.0 / (step + 1)})


def test_a_reconnecting_client_gets_the_gap_in_order_and_nothing_twice(team, job_id):
    redis = team.api.redis
    for step in range(5):
        metric(redis, job_id, step)
    seen = []
    with team.bob.websocket_connect(f"/ws/jobs/{job_id}") as ws:
        for _ in range(3):
            seen.append(ws.receive_json())
    assert [event["data"]["step"] for event in seen] == [0, 1, 2] and seen[0]["type"] == "metric"

    for step in range(5, 8):  # the job goes on while the browser is away
        metric(redis, job_id, step)
    with team.bob.websocket_connect(f"/ws/jobs/{job_id}?after={seen[-1]['id']}") as ws:
        for _ in range(5):
            seen.append(ws.receive_json())
        metric(redis, job_id, 8)  # and a live one after the replay
        seen.append(ws.receive_json())
    assert [event["data"]["step"] for event in seen] == list(range(9))
    assert len({event["id"] for event in seen}) == 9


def test_websockets_sign_in_like_rest(team, job_id):
    metric(team.api.redis, job_id, 0)
    with pytest.raises(WebSocketDisconnect) as refused:
        with team.anonymous.websocket_connect(f"/ws/jobs/{job_id}") as ws:
            ws.receive_json()
    assert refused.value.code == 4401
    token = team.alice.post("/api/tokens", json={"name": "script"}).json()["token"]
    with team.anonymous.websocket_connect(f"/ws/jobs/{job_id}?token={token}") as ws:
        assert ws.receive_json()["data"]["step"] == 0
    with pytest.raises(WebSocketDisconnect) as forged:
        with team.anonymous.websocket_connect(f"/ws/jobs/{job_id}?token=lnr_forged") as ws:
            ws.receive_json()
    assert forged.value.code == 4401


def test_a_cookie_from_another_origin_is_refused(team, job_id):
    with pytest.raises(WebSocketDisconnect) as refused:
        with team.bob.websocket_connect(f"/ws/jobs/{job_id}", headers={"origin": "https://evil.example"}) as ws:
            ws.receive_json()
    assert refused.value.code == 4401


def test_unknown_jobs_and_bad_ids_close_with_a_reason(team, job_id):
    with pytest.raises(WebSocketDisconnect) as missing:
        with team.bob.websocket_connect("/ws/jobs/999") as ws:
            ws.receive_json()
    assert missing.value.code == 4404
    with pytest.raises(WebSocketDisconnect) as bad:
        with team.bob.websocket_connect(f"/ws/jobs/{job_id}?after=drop-table") as ws:
            ws.receive_json()
    assert bad.value.code == 4422


def test_the_queue_stream_sends_what_happens_after_connecting(team, job_id):
    with team.bob.websocket_connect("/ws/queue") as ws:
        team.alice.post(f"/api/jobs/{job_id}/cancel")
        event = ws.receive_json()
    assert event["type"] == "cancelled" and event["data"]["job_id"] == job_id
    with team.bob.websocket_connect("/ws/queue?after=0-0") as ws:  # or everything still kept
        assert [ws.receive_json()["type"] for _ in range(2)] == ["added", "cancelled"]
    assert QUEUE_STREAM


def test_the_hardware_stream_relays_worker_telemetry(team):
    redis = team.api.redis
    publish(redis, HARDWARE_STREAM, "sample", {"worker": "gpu0@box", "utilization": 10})
    with team.bob.websocket_connect("/ws/hardware") as ws:
        publish(redis, HARDWARE_STREAM, "sample", {"worker": "gpu0@box", "utilization": 97})
        assert ws.receive_json()["data"]["utilization"] == 97
