"""Rate limits: every signed-in request, and the costly kinds (uploads, jobs, hub, previews) apart,
per user and shared by every API process through Redis; sign-in per client address."""
from __future__ import annotations

from fastapi.testclient import TestClient

from lanner.backend.app import create_app

from backend_helpers import CHAT_ROWS, PASSWORD, upload


def refused(response, bucket: str) -> bool:
    return (response.status_code == 429 and bucket in response.json()["detail"]
            and int(response.headers["Retry-After"]) >= 1)


def test_every_signed_in_request_counts_per_user_across_api_processes(team_with):
    team = team_with(LANNER_REQUESTS_PER_MINUTE="6")
    other_process = TestClient(create_app())  # a second API process on the same Redis
    other_process.cookies = team.bob.cookies
    statuses = [team.bob.get("/api/me").status_code for _ in range(3)]
    statuses += [other_process.get("/api/jobs").status_code for _ in range(3)]
    assert statuses == [200] * 6
    assert refused(team.bob.get("/api/me"), "requests") and refused(other_process.get("/api/me"), "requests")
    assert team.alice.get("/api/me").status_code == 200  # each user has their own bucket
    assert team.anonymous.get("/api/health").status_code == 200  # health is for monitors, never limited


def test_uploads_have_a_limit_of_their_own(team_with):
    team = team_with(LANNER_UPLOADS_PER_MINUTE="2")
    assert [upload(team.alice, f"{n}.jsonl", CHAT_ROWS).status_code for n in range(2)] == [201, 201]
    third = upload(team.alice, "3.jsonl", CHAT_ROWS)
    assert refused(third, "uploads")
    assert team.alice.get("/api/datasets").json()["total"] == 2  # the refused upload left nothing
    assert team.alice.get("/api/datasets").status_code == 200 and upload(team.bob, "b.jsonl", CHAT_ROWS).status_code == 201


def test_creating_jobs_is_limited(team_with, wakes):
    team = team_with(LANNER_JOBS_PER_MINUTE="2")
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    spec = {"method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": dataset_id}
    first = team.alice.post("/api/jobs", json=spec).json()["id"]
    assert team.alice.post(f"/api/jobs/{first}/clone", json={}).status_code == 201
    assert refused(team.alice.post("/api/jobs", json=spec), "jobs")
    assert team.alice.get("/api/jobs").json()["total"] == 2


def test_hub_requests_and_previews_are_limited(team_with):
    team = team_with(LANNER_HUB_REQUESTS_PER_MINUTE="1", LANNER_PREVIEWS_PER_MINUTE="1")
    assert team.bob.get("/api/models/search", params={"q": "x"}).status_code == 503  # offline, but counted
    assert refused(team.bob.get("/api/models/search", params={"q": "x"}), "hub_requests")
    assert refused(team.bob.post("/api/models/downloads", json={"repo_id": "a/b"}), "hub_requests")
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    assert team.bob.get(f"/api/datasets/{dataset_id}/preview").status_code == 409  # no tokenizer, but counted
    assert refused(team.bob.get(f"/api/datasets/{dataset_id}/token-stats"), "previews")


def test_sign_in_attempts_are_limited_per_client_address(team_with):
    team = team_with(LANNER_SIGN_INS_PER_MINUTE="6")  # the team's setup and two sign-ins used 3
    wrong = {"email": "bob@example.com", "password": "not the password"}
    assert [team.anonymous.post("/api/auth/sign-in", json=wrong).status_code for _ in range(3)] == [401] * 3
    right = team.anonymous.post("/api/auth/sign-in", json={"email": "bob@example.com", "password": PASSWORD})
    assert refused(right, "sign_ins")
    assert team.bob.get("/api/me").status_code == 200  # those signed in already are not affected
