"""A job's spec downloaded as YAML or as a command line, and YAML files read back through the API."""
from __future__ import annotations

from lanner.core import db
from lanner.core.models import Job, JobKind
from lanner.core.spec_files import MAX_YAML_BYTES

from backend_helpers import CHAT_ROWS, upload

MODEL = "builtin/SmolLM2-135M-Instruct"


def test_a_jobs_yaml_parses_back_and_queues_the_same_spec(team):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job = team.alice.post("/api/jobs", json={"method": "lora", "model": MODEL, "dataset_id": dataset,
                                             "lora": {"rank": 4}, "hyperparameters": {"max_steps": 3}}).json()
    download = team.bob.get(f"/api/jobs/{job['id']}/config")  # anyone on the team may read it
    assert download.status_code == 200, download.text
    assert download.headers["content-disposition"] == f'attachment; filename="job-{job["id"]}.yaml"'
    assert "resume_from" not in download.text  # a checkpoint of this job: a job made from the file starts afresh
    parsed = team.bob.post("/api/jobs/config/parse", json={"text": download.text}).json()
    assert parsed["source"] == "lanner" and parsed["valid"] and parsed["errors"] == [] and parsed["unmapped"] == []
    assert parsed["spec"] == job["config"]
    again = team.bob.post("/api/jobs", json=parsed["spec"])
    assert again.status_code == 201, again.text
    assert again.json()["config"] == job["config"]

    command = team.alice.get(f"/api/jobs/{job['id']}/config", params={"format": "command"})
    assert command.status_code == 200 and command.headers["content-type"].startswith("text/plain")
    assert command.text.startswith(f"cat > job-{job['id']}.yaml <<'LANNER_SPEC'\n")
    assert command.text.endswith(f'--url http://testserver --token "$LANNER_TOKEN" --dataset-id {dataset}\n')


def test_config_downloads_refuse_in_words(team):
    assert team.alice.get("/api/jobs/999/config").status_code == 404
    assert team.alice.get("/api/jobs/999/config", params={"format": "toml"}).status_code == 422
    with db.session_factory(team.api.settings.database_url)() as session:
        export = Job(owner_id=team.ids["alice"], kind=JobKind.export, name="export", method="export", model=MODEL,
                     config={"export": {}})
        session.add(export)
        session.commit()
        export_id = export.id
    refused = team.alice.get(f"/api/jobs/{export_id}/config")
    assert refused.status_code == 409 and "only a training job has a spec" in refused.json()["detail"]


def test_an_axolotl_file_is_read_with_its_errors_unmapped_keys_and_dataset_note(team):
    text = ("base_model: Qwen/Qwen2.5-0.5B\nadapter: lora\nlora_r: 0\nlearning_rate: 0.0002\noptimizer: adamw_torch\n"
            "datasets:\n  - path: tatsu-lab/alpaca\n    type: alpaca\n")
    parsed = team.alice.post("/api/jobs/config/parse", json={"text": text}).json()
    assert parsed["source"] == "axolotl" and not parsed["valid"]
    assert [(e["loc"], e["type"]) for e in parsed["errors"]] == [(["body", "lora", "rank"], "greater_than_equal")]
    assert parsed["spec"]["lora"] == {"rank": 0} and parsed["unmapped"] == ["optimizer"]
    assert "tatsu-lab/alpaca" in parsed["notes"][0]


def test_bad_files_are_422s_in_words(team):
    laughs = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 10))
    for text, words in [(laughs, "aliases"), ("method: [", "not valid YAML"), ("[1, 2]", "mapping")]:
        response = team.alice.post("/api/jobs/config/parse", json={"text": text})
        assert response.status_code == 422 and words in response.json()["detail"], response.text
    too_long = team.alice.post("/api/jobs/config/parse", json={"text": "#" * (MAX_YAML_BYTES + 1)})
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["loc"] == ["body", "text"]
    assert team.alice.post("/api/jobs/config/parse", json={"text": "method: lora", "source": "x"}).status_code == 422
