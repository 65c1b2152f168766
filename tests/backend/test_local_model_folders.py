"""Local models come only from folders an admin allows (issue 24): no other server directory can be
loaded or probed through the estimate, a job or a dataset's token statistics."""
from __future__ import annotations

import pytest

from lanner.core.model_paths import NOT_ALLOWED

from backend_helpers import CHAT_ROWS, upload

TINY_CONFIG = ('{"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, "vocab_size": 1000, '
               '"num_attention_heads": 4, "num_key_value_heads": 4}')


def estimate(client, model: str):
    return client.post("/api/jobs/estimate", json={"method": "lora", "model": model, "dataset_id": 1, "gpus": 0})


@pytest.mark.parametrize("model", ["/root", "/proc/self", "/etc", "/nonexistent"])
def test_server_directories_are_refused_alike_whether_they_exist_or_not(team, wakes, model):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    for response in (estimate(team.alice, model),
                     team.alice.post("/api/jobs", json={"method": "lora", "model": model, "dataset_id": dataset})):
        assert response.status_code == 422, response.text
        assert response.json()["detail"][0]["msg"].endswith(NOT_ALLOWED)
    assert team.alice.get("/api/jobs").json()["total"] == 0


def test_a_path_leading_out_of_the_models_folder_is_refused_after_resolving(team, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_text(TINY_CONFIG)
    (team.api.settings.models_dir / "link").symlink_to(outside)
    assert estimate(team.alice, str(team.api.settings.models_dir / "link")).status_code == 422
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    for model in ("../../../../etc", "../outside", str(outside)):
        stats = team.alice.get(f"/api/datasets/{dataset}/token-stats", params={"model": model})
        assert stats.status_code == 409 and NOT_ALLOWED in stats.json()["detail"], stats.text


def test_an_admin_allows_another_folder(team_with, tmp_path):
    shared = tmp_path / "shared-models"
    (shared / "tiny").mkdir(parents=True)
    (shared / "tiny" / "config.json").write_text(TINY_CONFIG)
    team = team_with(LANNER_LOCAL_MODEL_DIRS=str(shared))
    assert estimate(team.alice, str(shared / "tiny")).json()["estimate"]["total_bytes"] > 0
    assert estimate(team.alice, str(team.api.settings.models_dir)).status_code == 422  # the default is replaced
