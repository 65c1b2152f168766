"""What a third outside probe (a studio of `lanner up`, probed over HTTP) broke: each answer is a 4xx in
words, never a 500, and a spec names only models the studio may read."""
from __future__ import annotations

import codecs

import pytest

from lanner.core import db
from lanner.core.models import Artifact, ArtifactKind, Job, JobStatus

from backend_helpers import CHAT_ROWS, MODEL, field_errors, submit, upload


@pytest.mark.parametrize("filename, content", [
    ("lone-surrogate.jsonl", codecs.BOM_UTF16_LE + '{"text": "a"}\n'.encode("utf-16-le") + b"\x00\xd8"),
    ("odd-byte.jsonl", codecs.BOM_UTF16_LE + '{"text": "a"}\n'.encode("utf-16-le") + b"A"),
    ("lone-surrogate.csv", codecs.BOM_UTF16_BE + "text\na\n".encode("utf-16-be") + b"\xdc\x00"),
    ("odd-byte.json", codecs.BOM_UTF16_LE + b"["),
], ids=["jsonl-lone-surrogate", "jsonl-odd-byte", "csv-lone-surrogate", "json-odd-byte"])
def test_a_file_that_is_utf16_only_at_its_start_is_refused_in_words(team, filename, content):
    response = upload(team.alice, filename, content)
    assert response.status_code == 422, response.text
    assert "not UTF-16 throughout" in response.json()["detail"]


@pytest.mark.parametrize("model", ["builtin/../..", "builtin/", "builtin/SmolLM2-135M-Instruct/../../.."])
def test_only_the_built_in_model_is_a_builtin_name(team, model):
    # any builtin/ name passed, and the worker reads one as a folder under DATA_DIR/models: `..` led out of it
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    errors = field_errors(submit(team.alice, dataset, model=model, gpus=0))
    assert "the built-in model is builtin/SmolLM2-135M-Instruct" in errors[("model",)]
    assert submit(team.alice, dataset, model=MODEL, gpus=0).status_code == 201


@pytest.mark.parametrize("text", ["method: lora\nname: !!binary /w==\n", "base_model: !!binary 7aCA\n",
                                  "method: lora\nname: !!binary AAAA\n"])
def test_yaml_binary_values_are_refused_in_words(team, text):
    # !!binary made bytes: not UTF-8 ones were a 500 when answered, UTF-8 ones could smuggle a NUL
    response = team.alice.post("/api/jobs/config/parse", json={"text": text})
    assert response.status_code == 422, response.text
    assert "tag:yaml.org,2002:binary" in response.json()["detail"]


def sweep_of(client, dataset, parameters, **fields):
    base = {"method": "lora", "model": MODEL, "dataset_id": dataset, "gpus": 0}
    return client.post("/api/sweeps", json={"base": base, "metric": "loss", "parameters": parameters, **fields})


def test_a_random_range_wider_than_a_float_is_refused_in_words(team, wakes):
    # a draw from it was infinite, and rounding it for an integer field a 500
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    response = sweep_of(team.alice, dataset, [{"field": "hyperparameters.batch_size", "low": -1e308, "high": 1e308}],
                        strategy="random", budget=2)
    assert response.status_code == 422, response.text
    assert "wider than a number holds" in response.json()["detail"][0]["msg"]


def test_a_random_search_of_a_huge_grid_draws_without_listing_it(team, wakes):
    # 8 fields of 32 values: the 32**8 combinations were listed to draw from (gigabytes, then a MemoryError)
    fields = ["learning_rate", "epochs", "batch_size", "gradient_accumulation", "warmup_ratio", "weight_decay", "seed"]
    values = {"learning_rate": [n / 1e5 for n in range(1, 33)], "warmup_ratio": [n / 100 for n in range(32)],
              "weight_decay": [n / 100 for n in range(32)]}
    parameters = [{"field": f"hyperparameters.{name}", "values": values.get(name, list(range(1, 33)))}
                  for name in fields] + [{"field": "lora.rank", "values": list(range(1, 33))}]
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    response = sweep_of(team.alice, dataset, parameters, strategy="random", budget=3)
    assert response.status_code == 201, response.text
    assert len(response.json()["job_ids"]) == 3


@pytest.mark.parametrize("header", ["bytes=0-" + "9" * 5000, "bytes=-" + "9" * 5000, "bytes=" + "0" * 5000 + "-1"])
def test_a_range_of_more_digits_than_python_reads_is_a_416(team, wakes, header):
    # int() refuses over 4300 digits: the range check, then Starlette's, was a 500
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job_id = submit(team.alice, dataset).json()["id"]
    (team.api.settings.data_dir / "artifacts" / str(job_id)).mkdir(parents=True)
    (team.api.settings.data_dir / "artifacts" / str(job_id) / "model.gguf").write_bytes(b"x" * 100)
    with db.session_factory(team.api.settings.database_url)() as session:
        session.get(Job, job_id).status = JobStatus.succeeded
        artifact = Artifact(job_id=job_id, kind=ArtifactKind.gguf, name="gguf", path=f"artifacts/{job_id}/model.gguf",
                            size_bytes=100)
        session.add(artifact)
        session.commit()
        url = f"/api/artifacts/{artifact.id}/download"
    response = team.bob.get(url, headers={"Range": header})
    assert response.status_code == 416 and response.headers["content-range"] == "bytes */100"
    assert len(response.json()["detail"]) < 300  # the header is cut short in the answer
    assert team.bob.get(url, headers={"Range": "bytes=90-" + "9" * 30}).content == b"x" * 10  # still served


@pytest.mark.parametrize("schema, words", [({"required": 5}, "json_schema.required must be a list"),
                                           ({"enum": 5}, "json_schema.enum must be a list"),
                                           ({"properties": {"a": 5}}, "json_schema.properties.a is not a schema"),
                                           ({"type": {"a": 1}}, "json_schema.type must be a type's name")])
def test_a_json_schema_reward_reads_only_a_schema_it_can_check(team, schema, words):
    # each failed every batch in the sandbox, with a traceback naming the server's files
    response = team.alice.post("/api/rewards/test", json={"reward_functions": [{"kind": "json_schema",
                                                                                "json_schema": schema}],
                                                          "completions": ['{"a": 1}']})
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"][0]["msg"]
    fine = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    response = team.alice.post("/api/rewards/test", json={"reward_functions": [{"kind": "json_schema",
                                                                                "json_schema": fine}],
                                                          "completions": ['{"a": 1}']})
    assert response.status_code == 200 and response.json()["rows"][0]["total"] == 1.0
