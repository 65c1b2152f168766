"""Who may call what: anonymous, a member on their own resource, a member on another's, an admin.
Every cell gets a fresh resource of alice's (the member "own" is alice, "other" is bob)."""
from __future__ import annotations

import pytest

from lanner.core import db
from lanner.core.models import Artifact, Job, JobStatus

from backend_helpers import CHAT_ROWS, upload

ACTORS = ("anonymous", "alice", "bob", "admin")


def make_resource(team, kind: str) -> int | None:
    if kind == "none":
        return None
    if kind == "token":
        return team.alice.post("/api/tokens", json={"name": "t"}).json()["id"]
    if kind == "user":
        return team.ids["alice"]
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    if kind == "dataset":
        return dataset_id
    job_id = team.alice.post("/api/jobs", json={"method": "lora", "model": "builtin/SmolLM2-135M-Instruct",
                                                "dataset_id": dataset_id}).json()["id"]
    if kind == "job":
        return job_id
    with db.session_factory(team.api.settings.database_url)() as session:
        session.get(Job, job_id).status = JobStatus.failed
        folder = team.api.settings.artifacts_dir / str(job_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.gguf").write_bytes(b"gguf")
        artifact = Artifact(job_id=job_id, kind="gguf", name="model.gguf", path=f"artifacts/{job_id}/model.gguf")
        session.add(artifact)
        if kind == "trained_job":
            session.get(Job, job_id).status = JobStatus.succeeded
            session.add(Artifact(job_id=job_id, kind="adapter", name="adapter", path=f"artifacts/{job_id}/adapter"))
        session.commit()
        return artifact.id if kind == "artifact" else job_id


SPEC = {"method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": 1}
NEW_USER = {"email": "new@example.com", "display_name": "New", "password": "long enough pw"}
CASES = [
    # method, path, resource, body, (anonymous, alice on own, bob on alice's, admin on alice's)
    ("GET", "/api/me", "none", None, (401, 200, 200, 200)),
    ("PATCH", "/api/me", "none", {"display_name": "X"}, (401, 200, 200, 200)),
    ("GET", "/api/users", "none", None, (401, 200, 200, 200)),
    ("POST", "/api/users", "none", NEW_USER, (401, 403, 403, 201)),
    ("PATCH", "/api/users/{id}", "user", {"display_name": "Y"}, (401, 403, 403, 200)),
    ("POST", "/api/tokens", "none", {"name": "x"}, (401, 201, 201, 201)),
    ("GET", "/api/tokens", "none", None, (401, 200, 200, 200)),
    ("DELETE", "/api/tokens/{id}", "token", None, (401, 204, 404, 404)),
    ("POST", "/api/jobs", "dataset", None, (401, 201, 201, 201)),
    ("GET", "/api/jobs", "none", None, (401, 200, 200, 200)),
    ("POST", "/api/jobs/estimate", "none", SPEC, (401, 200, 200, 200)),
    ("GET", "/api/queue", "none", None, (401, 200, 200, 200)),
    ("GET", "/api/jobs/{id}", "job", None, (401, 200, 200, 200)),
    ("POST", "/api/jobs/{id}/cancel", "job", None, (401, 200, 403, 200)),
    ("POST", "/api/jobs/{id}/move", "job", {"move": "top"}, (401, 200, 403, 200)),
    ("POST", "/api/jobs/{id}/retry", "failed_job", None, (401, 201, 403, 201)),
    ("POST", "/api/jobs/{id}/clone", "job", {}, (401, 201, 201, 201)),
    ("DELETE", "/api/jobs/{id}", "job", None, (401, 204, 403, 204)),
    ("POST", "/api/jobs/{id}/export", "trained_job", {"gguf_types": ["q8_0"]}, (401, 201, 201, 201)),
    ("GET", "/api/jobs/{id}/artifacts", "failed_job", None, (401, 200, 200, 200)),
    ("GET", "/api/jobs/{id}/metrics", "job", None, (401, 200, 200, 200)),
    ("GET", "/api/jobs/{id}/device-samples", "job", None, (401, 200, 200, 200)),
    ("GET", "/api/artifacts/{id}/download", "artifact", None, (401, 200, 200, 200)),
    ("DELETE", "/api/artifacts/{id}", "artifact", None, (401, 204, 403, 204)),
    ("GET", "/api/datasets", "none", None, (401, 200, 200, 200)),
    ("GET", "/api/datasets/usage", "none", None, (401, 200, 200, 200)),
    ("GET", "/api/datasets/{id}", "dataset", None, (401, 200, 200, 200)),
    ("DELETE", "/api/datasets/{id}", "dataset", None, (401, 204, 403, 204)),
    ("GET", "/api/datasets/{id}/preview", "dataset", None, (401, 409, 409, 409)),  # 409: no tokenizer here
    ("GET", "/api/datasets/{id}/token-stats", "dataset", None, (401, 409, 409, 409)),
    ("POST", "/api/datasets?filename=d.jsonl", "none", CHAT_ROWS, (401, 201, 201, 201)),
    ("GET", "/api/models", "none", None, (401, 200, 200, 200)),
    ("GET", "/api/models/search?q=x", "none", None, (401, 503, 503, 503)),
    ("GET", "/api/setup", "none", None, (200, 200, 200, 200)),
    ("GET", "/api/health", "none", None, (200, 200, 200, 200)),
]


@pytest.mark.parametrize("method, path, resource, body, expected", CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_authorisation_matrix(team, wakes, method, path, resource, body, expected):
    for actor, status in zip(ACTORS, expected):
        resource_id = make_resource(team, resource)
        payload = body
        if path == "/api/jobs":
            payload = {**SPEC, "dataset_id": resource_id} if method == "POST" else None
        if path == "/api/users" and method == "POST":
            payload = {**NEW_USER, "email": f"new-{actor}@example.com"}
        url = path.replace("{id}", str(resource_id))
        client = team.as_(actor)
        if isinstance(payload, str):
            response = client.request(method, url, content=payload.encode())
        else:
            response = client.request(method, url, json=payload)
        assert response.status_code == status, f"{actor}: {response.status_code} {response.text[:300]}"
        if status >= 400:
            assert "detail" in response.json()
