"""The model catalog, the hub's offline answer, and errors: JSON with the right status everywhere."""
from __future__ import annotations

import time

from lanner.core.spec import JobSpec
from lanner.core.default_model import DEFAULT_MODEL_ID


def test_the_catalog_has_the_default_the_curated_bases_and_local_models(team):
    folder = team.api.settings.models_dir / "my-finetune"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    catalog = team.bob.get("/api/models").json()
    assert catalog["default"]["id"] == DEFAULT_MODEL_ID == "builtin/SmolLM2-135M-Instruct"
    families = {model["family"] for model in catalog["curated"]}
    assert {"Llama 3.2", "Llama 3.1", "Qwen 2.5", "Qwen 3", "Mistral", "Gemma 2", "Gemma 3", "Phi-3", "Phi-4",
            "SmolLM2", "Qwen 3 MoE", "gpt-oss", "Mixtral"} <= families
    assert all(model["parameters"] > 10**8 for model in catalog["curated"])
    assert catalog["local"] == [{"id": str(folder), "name": "my-finetune", "family": None, "parameters": None,
                                 "gated": False, "source": "local", "downloaded": False}]
    assert not any(model["downloaded"] for model in catalog["curated"])
    assert JobSpec(method="lora", model=str(folder), dataset_id=1).model == str(folder)  # usable in a job
    assert team.anonymous.get("/api/models").status_code == 401


def test_hub_search_answers_offline_quickly(team):
    started = time.monotonic()
    response = team.bob.get("/api/models/search", params={"q": "llama"})
    assert response.status_code == 503 and response.json()["detail"].startswith("offline")
    assert time.monotonic() - started < 5
    assert team.bob.get("/api/models/search").status_code == 422


def test_the_real_hub_is_unreachable_here_and_says_so(team_with):
    team = team_with(LANNER_HUB_URL="https://huggingface.co", LANNER_HUB_TIMEOUT_S="2")
    started = time.monotonic()
    response = team.bob.get("/api/models/search", params={"q": "qwen"})
    assert time.monotonic() - started < 10
    assert response.status_code == 503 and "offline" in response.json()["detail"]


def test_errors_are_json_with_the_right_status(team):
    assert team.anonymous.get("/api/jobs").json() == {
        "detail": "Sign in first (session cookie or bearer API token)"}
    assert team.bob.get("/api/jobs/abc").status_code == 422
    not_json = team.bob.post("/api/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert not_json.status_code == 422 and isinstance(not_json.json()["detail"], list)
    assert team.bob.delete("/api/me").status_code == 405 and "detail" in team.bob.delete("/api/me").json()
    assert team.bob.get("/api/nope").json()["detail"].startswith("No such endpoint")
    for url in ("/api/jobs/99999999999999999999", "/api/datasets/0", "/api/jobs?offset=99999999999999999999",
                "/api/jobs/4294967296/artifacts"):
        assert team.bob.get(url).status_code == 422, url  # not a driver overflow


def test_request_bodies_over_the_limit_are_refused(team_with):
    team = team_with(LANNER_MAX_BODY_BYTES="2048")
    big = {"method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": 1, "name": "x" * 5000}
    announced = team.bob.post("/api/jobs", json=big)
    assert announced.status_code == 413 and "detail" in announced.json()

    def chunks():
        yield b'{"name": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}'

    streamed = team.bob.post("/api/tokens", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413
    assert team.bob.post("/api/tokens", json={"name": "small"}).status_code == 201


def test_unexpected_errors_are_json_500s(team, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("lanner.backend.routers.catalog.catalog_entries", broken)
    from fastapi.testclient import TestClient

    client = TestClient(team.api.app, raise_server_exceptions=False)
    client.cookies = team.bob.cookies
    response = client.get("/api/models")
    assert response.status_code == 500 and "boom" not in response.text and "detail" in response.json()


def test_the_openapi_schema_lists_every_route(team):
    paths = team.anonymous.get("/api/openapi.json").json()["paths"]
    for path in ("/api/setup", "/api/auth/sign-in", "/api/me", "/api/users", "/api/tokens", "/api/jobs",
                 "/api/jobs/{job_id}/move", "/api/queue", "/api/datasets", "/api/models",
                 "/api/artifacts/{artifact_id}/download"):
        assert path in paths, path
    assert "application/octet-stream" in paths["/api/datasets"]["post"]["requestBody"]["content"]


def test_every_response_of_the_openapi_document_has_a_schema(team):
    document = team.anonymous.get("/api/openapi.json").json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status in ("204",) or (path.startswith("/api/auth/sign-out")):
                    continue
                assert response.get("content"), f"{method.upper()} {path} {status} has no body schema"
            if "requestBody" in operation:
                assert {"400", "413", "422"} <= set(operation["responses"]), f"{method.upper()} {path}"
    preview = document["paths"]["/api/datasets/{dataset_id}/preview"]["get"]["responses"]
    assert preview["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/DatasetPreview"}
    assert "TokenStats" in document["components"]["schemas"] and "ErrorOut" in document["components"]["schemas"]


def test_times_carry_their_zone_on_sqlite_too(team):
    from datetime import datetime

    created = team.bob.get("/api/me").json()["created_at"]
    assert datetime.fromisoformat(created).utcoffset() is not None, created
