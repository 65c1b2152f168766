"""Sessions end when they should (issue 24): on a password change (all but the session that changed
it), on a reset by an admin, on deactivation; an open stream stops after sign-out or deactivation."""
from __future__ import annotations

import time

import pytest
from starlette.websockets import WebSocketDisconnect

from lanner.backend.deps import WS_UNAUTHORISED
from lanner.backend.routers.live import SESSION_RECHECK_S

from backend_helpers import PASSWORD

pytestmark = pytest.mark.timeout(60)
NEW_PASSWORD = "a new password 1"


def test_a_password_change_ends_every_other_session(team):
    other = team.api.signed_in("alice@example.com")
    changed = team.alice.patch("/api/me", json={"password": NEW_PASSWORD, "current_password": PASSWORD})
    assert changed.status_code == 200
    assert team.alice.get("/api/me").status_code == 200  # the session that changed it
    assert other.get("/api/me").status_code == 401


def test_a_reset_by_an_admin_ends_the_users_sessions(team):
    assert team.admin.patch(f"/api/users/{team.ids['alice']}", json={"password": NEW_PASSWORD}).status_code == 200
    assert team.alice.get("/api/me").status_code == 401
    assert team.bob.get("/api/me").status_code == 200  # nobody else's
    assert team.api.signed_in("alice@example.com", NEW_PASSWORD).get("/api/me").status_code == 200


def test_deactivation_ends_the_sessions_for_good(team):
    assert team.admin.patch(f"/api/users/{team.ids['bob']}", json={"is_active": False}).status_code == 200
    assert team.admin.patch(f"/api/users/{team.ids['bob']}", json={"is_active": True}).status_code == 200
    assert team.bob.get("/api/me").status_code == 401  # reactivated, but the old cookie stays dead


def _closed_within(socket, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    with pytest.raises(WebSocketDisconnect) as closed:
        while time.monotonic() < deadline:
            socket.receive_json()
    return closed.value.code


@pytest.mark.parametrize("how", ["sign-out", "deactivation"])
def test_an_open_stream_stops_when_the_session_ends(team, how):
    with team.bob.websocket_connect("/ws/queue") as socket:
        if how == "sign-out":
            assert team.bob.post("/api/auth/sign-out").status_code == 204
        else:
            assert team.admin.patch(f"/api/users/{team.ids['bob']}", json={"is_active": False}).status_code == 200
        assert _closed_within(socket, SESSION_RECHECK_S + 5) == WS_UNAUTHORISED


def test_the_playground_answers_no_question_after_sign_out(team):
    with team.bob.websocket_connect("/ws/playground") as socket:
        assert team.bob.post("/api/auth/sign-out").status_code == 204
        socket.send_json({"type": "generate", "id": 1, "job_id": 1, "messages": [{"role": "user", "content": "hi"}]})
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_json()
    assert closed.value.code == WS_UNAUTHORISED
