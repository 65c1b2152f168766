"""Input an outside probe sent (issue 24): each is refused in words, never a 500, on both databases."""
from __future__ import annotations

import json

import pytest
from starlette.websockets import WebSocketDisconnect

from lanner.backend.deps import WS_NOT_FOUND
from lanner.core import db
from lanner.core.models import Artifact

from backend_helpers import CHAT_ROWS, upload

MODEL = "builtin/SmolLM2-135M-Instruct"


def spec(dataset_id, **changes) -> dict:
    return {"method": "lora", "model": MODEL, "dataset_id": dataset_id, **changes}


def refusal(response) -> str:
    """The words of an edge refusal: a 422 with one entry in FastAPI's format."""
    assert response.status_code == 422, response.text
    [issue] = response.json()["detail"]
    return issue["msg"]


def post_raw(client, path: str, text: str):
    return client.post(path, content=text.encode("utf-8", "surrogatepass"),
                       headers={"content-type": "application/json"})


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("path", ["/api/jobs", "/api/jobs/estimate"])
def test_numbers_json_has_not_are_refused_in_words(team, path, number):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    body = json.dumps(spec(dataset, hyperparameters={"learning_rate": 0.5})).replace("0.5", number)
    assert "finite number" in refusal(post_raw(team.alice, path, body))


def test_the_spec_refuses_nan_given_in_python_too():
    from pydantic import ValidationError

    from lanner.core.spec import JobSpec

    with pytest.raises(ValidationError, match="finite"):
        JobSpec.model_validate(spec(1, hyperparameters={"warmup_ratio": float("nan")}))


def test_text_no_database_can_hold_is_refused_at_the_edge(team_on_each_database):
    team = team_on_each_database
    nul, surrogate = "a\\u0000b", "a\\ud800b"
    for text in (nul, surrogate):
        for path, body in [("/api/tokens", '{"name": "%s"}' % text),
                           ("/api/auth/sign-in", '{"email": "%s@example.com", "password": "x"}' % text),
                           ("/api/users", '{"email": "x@example.com", "display_name": "%s", "password": "long enough"}' % text)]:
            assert "NUL" in refusal(post_raw(team.admin, path, body)) or text == surrogate
            assert "surrogate" in refusal(post_raw(team.admin, path, body)) or text == nul
        response = team.admin.patch("/api/me", content=('{"display_name": "%s"}' % text).encode(),
                                    headers={"content-type": "application/json"})
        assert refusal(response)
    for path in ("/api/jobs?q=a%00b", "/api/datasets?q=%00", "/api/jobs?method=%00", "/api/jobs/%00"):
        assert "NUL" in refusal(team.admin.get(path))
    assert team.admin.get("/api/me").status_code == 200  # the connection and the session still work


def test_nesting_too_deep_is_refused_in_a_body_and_in_an_upload(team):
    deep = "[" * 100_000 + "]" * 100_000
    assert "nested" in refusal(post_raw(team.alice, "/api/jobs/estimate", deep))
    response = upload(team.alice, "deep.json", deep)
    assert response.status_code == 422 and "nested" in json.dumps(response.json()), response.text
    rows = CHAT_ROWS + '{"messages": %s}\n' % deep
    report = upload(team.alice, "deep.jsonl", rows).json()["report"]
    assert any("nested" in row["reason"] for row in report["bad_rows"])


def test_a_dataset_row_with_a_lone_surrogate_is_a_bad_row_not_a_500_later(team):
    rows = CHAT_ROWS + '{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "x"}]}\n'
    dataset = upload(team.alice, "odd.jsonl", rows).json()
    assert any("surrogate" in row["reason"] for row in dataset["report"]["bad_rows"])
    assert team.alice.get(f"/api/datasets/{dataset['id']}/preview").status_code != 500


def test_an_artifact_file_name_no_file_system_holds_is_a_404(team, wakes):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job_id = team.alice.post("/api/jobs", json=spec(dataset)).json()["id"]
    settings = team.api.settings
    (settings.artifacts_dir / str(job_id) / "adapter").mkdir(parents=True)
    with db.session_factory(settings.database_url)() as session:
        artifact = Artifact(job_id=job_id, kind="adapter", name="adapter", path=f"artifacts/{job_id}/adapter")
        session.add(artifact)
        session.commit()
        artifact_id = artifact.id
    response = team.alice.get(f"/api/artifacts/{artifact_id}/download", params={"file": "a" * 300})
    assert response.status_code == 404, response.text


def test_an_out_of_range_job_id_on_the_job_socket_closes_with_a_code(team):
    with team.alice.websocket_connect(f"/ws/jobs/{2**63}") as socket:
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_text()
    assert closed.value.code == WS_NOT_FOUND


def test_resume_from_dots_and_a_boolean_dataset_id_are_refused(team):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    for name in ("..", "."):
        response = team.alice.post("/api/jobs", json=spec(dataset, resume_from=name))
        assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] == "resume_from"
    response = team.alice.post("/api/jobs", json=spec(True))
    assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] == "dataset_id"


def test_percent_and_underscore_in_a_search_are_letters(team_on_each_database, wakes):
    team = team_on_each_database
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    for name in ("plain", "50% off", "a_b"):
        assert team.alice.post("/api/jobs", json=spec(dataset, name=name)).status_code == 201
    names = lambda q: sorted(job["name"] for job in team.alice.get("/api/jobs", params={"q": q}).json()["items"])  # noqa: E731
    assert names("%") == ["50% off"]
    assert names("_") == ["a_b"]


def test_a_long_file_name_keeps_its_extension(team):
    response = upload(team.alice, "a" * 240 + ".jsonl", CHAT_ROWS)
    assert response.status_code == 201, response.text


def test_a_damaged_parquet_file_is_refused_without_the_servers_path(team):
    response = upload(team.alice, "broken.parquet", b"PAR1 not really parquet PAR1")
    assert response.status_code == 422
    assert str(team.api.settings.data_dir) not in response.text and "broken.parquet" in response.text
