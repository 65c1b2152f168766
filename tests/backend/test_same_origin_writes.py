"""Cookie-authenticated changes from another origin are refused (issue 24): a cancel sent as a form
post and a dataset upload sent as text/plain from another port of the same host."""
from __future__ import annotations

from backend_helpers import CHAT_ROWS, upload

OTHER_PORT = {"origin": "http://testserver:8081"}


def test_a_cross_origin_form_post_and_text_upload_are_refused(team, wakes):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job = team.alice.post("/api/jobs", json={"method": "lora", "model": "builtin/SmolLM2-135M-Instruct",
                                             "dataset_id": dataset}).json()["id"]
    forged_cancel = team.alice.post(f"/api/jobs/{job}/cancel", content=b"x=1", headers={
        **OTHER_PORT, "content-type": "application/x-www-form-urlencoded"})
    assert forged_cancel.status_code == 403 and "this studio's own pages" in forged_cancel.json()["detail"]
    forged_upload = team.alice.post("/api/datasets", params={"filename": "x.jsonl"}, content=CHAT_ROWS,
                                    headers={**OTHER_PORT, "content-type": "text/plain"})
    assert forged_upload.status_code == 403
    assert team.alice.get(f"/api/jobs/{job}").json()["status"] == "queued"
    assert len(team.alice.get("/api/datasets").json()["items"]) == 1


def test_same_origin_writes_reads_and_bearer_tokens_pass(team, wakes):
    assert team.alice.patch("/api/me", json={"display_name": "A"}, headers={"origin": "http://testserver"}).status_code == 200
    assert team.alice.get("/api/me", headers=OTHER_PORT).status_code == 200  # reading changes nothing
    token = team.alice.post("/api/tokens", json={"name": "script"}).json()["token"]
    script = team.api.client()
    response = script.patch("/api/me", json={"display_name": "B"},
                            headers={**OTHER_PORT, "authorization": f"Bearer {token}"})
    assert response.status_code == 200
