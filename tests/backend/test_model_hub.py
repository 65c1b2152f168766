"""Hub search and model downloads, against a stand-in hub (a real HTTP server started here), and the
"offline" answer of a machine without the hub (this one: the real hub is unreachable from here)."""
from __future__ import annotations

import json
import os
import time

import pytest

from hub_standin import Repo, StandInHub

from lanner.core.model_paths import HUB_SOURCE_FILE, hub_commit

pytestmark = pytest.mark.timeout(120)
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "vocab_size": 256, "tie_word_embeddings": True}
WEIGHTS = os.urandom(3 * 1024 * 1024 + 17)  # a few chunks, so a download can be cut part-way


def tiny_repo(**options) -> Repo:
    return Repo({"config.json": json.dumps(CONFIG).encode(), "tokenizer.json": b'{"version": "1.0"}',
                 "tokenizer_config.json": b"{}", "model.safetensors": WEIGHTS, "README.md": b"# tiny",
                 "model.gguf": b"GGUF not needed", "original/consolidated.pth": b"not needed"}, **options)


@pytest.fixture
def hub():
    standin = StandInHub({"lanner-test/tiny-llama": tiny_repo(downloads=10),
                          "lanner-test/tiny-llama-gated": tiny_repo(gated=True),
                          "lanner-test/no-weights": Repo({"config.json": b"{}", "README.md": b"x"}),
                          "other/qwen-small": tiny_repo(downloads=5)}).start()
    yield standin
    standin.stop()


@pytest.fixture
def team_and_hub(team_with, hub):
    return team_with(LANNER_HUB_URL=hub.url, LANNER_HUB_TIMEOUT_S="5"), hub


def wait_for_download(client, repo_id: str) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = {item["repo_id"]: item for item in client.get("/api/models/downloads").json()}
        if found.get(repo_id, {}).get("status") not in (None, "downloading"):
            return found[repo_id]
        time.sleep(0.05)
    raise AssertionError(f"the download of {repo_id} did not finish")


def test_search_asks_the_hub_for_text_generation_models(team_and_hub):
    team, hub = team_and_hub
    response = team.bob.get("/api/models/search", params={"q": "tiny", "limit": 5})
    assert response.status_code == 200, response.text
    assert [model["id"] for model in response.json()] == ["lanner-test/tiny-llama", "lanner-test/tiny-llama-gated"]
    assert response.json()[0] == {"id": "lanner-test/tiny-llama", "downloads": 10, "likes": 1, "gated": False,
                                  "downloaded": False}
    assert response.json()[1]["gated"] is True
    asked = hub.seen[-1].path
    assert asked.startswith("/api/models?") and "search=tiny" in asked and "filter=text-generation" in asked
    assert team.anonymous.get("/api/models/search", params={"q": "tiny"}).status_code == 401


def test_a_download_fetches_what_training_needs_into_the_models_folder(team_and_hub):
    team, hub = team_and_hub
    started = team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama"})
    assert started.status_code == 202, started.text
    assert started.json()["status"] in ("downloading", "done") and started.json()["bytes_total"] > len(WEIGHTS)
    done = wait_for_download(team.bob, "lanner-test/tiny-llama")
    assert done["status"] == "done", done
    folder = team.api.settings.models_dir / "lanner-test" / "tiny-llama"
    assert done["path"] == str(folder) and done["bytes_done"] == done["bytes_total"]
    assert sorted(path.name for path in folder.iterdir()) == ["config.json", HUB_SOURCE_FILE, "model.safetensors",
                                                             "tokenizer.json", "tokenizer_config.json"]
    assert hub_commit(folder, "lanner-test/tiny-llama") == hub.repos["lanner-test/tiny-llama"].commit  # for exports
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert not (team.api.settings.data_dir / "downloads" / "lanner-test--tiny-llama").exists()
    # Downloaded models are here for good: the catalog lists them, jobs get a memory estimate from
    # their config, and asking again downloads nothing.
    local = team.bob.get("/api/models").json()["local"]
    assert {"id": str(folder), "name": "lanner-test/tiny-llama"}.items() <= local[0].items()
    estimate = team.bob.post("/api/jobs/estimate", json={"method": "lora", "model": "lanner-test/tiny-llama",
                                                         "dataset_id": 1, "gpus": 1}).json()
    assert estimate["estimate"]["total_bytes"] > 0
    requests_before = len(hub.seen)
    again = team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama"})
    assert again.status_code == 200 and again.json()["status"] == "done" and len(hub.seen) == requests_before
    assert team.bob.get("/api/models/search", params={"q": "tiny-llama"}).json()[0]["downloaded"] is True


def test_a_dropped_connection_is_continued_with_a_range(team_and_hub):
    team, hub = team_and_hub
    hub.cut_after["model.safetensors"] = 1024 * 1024
    team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama"})
    failed = wait_for_download(team.alice, "lanner-test/tiny-llama")
    assert failed["status"] == "failed" and "broke off" in failed["error"] and "ask again" in failed["error"]
    partial = team.api.settings.data_dir / "downloads" / "lanner-test--tiny-llama" / "model.safetensors"
    assert partial.stat().st_size == 1024 * 1024
    assert not (team.api.settings.models_dir / "lanner-test" / "tiny-llama").exists()  # never half a model

    assert team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama"}).status_code == 202
    assert wait_for_download(team.alice, "lanner-test/tiny-llama")["status"] == "done"
    assert [seen.range for seen in hub.seen if seen.path.endswith("/model.safetensors")][-1] == f"bytes={1024 * 1024}-"
    folder = team.api.settings.models_dir / "lanner-test" / "tiny-llama"
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS


def test_gated_models_need_a_token(team_and_hub):
    team, hub = team_and_hub
    refused = team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama-gated"})
    assert refused.status_code == 403 and "LANNER_HUB_TOKEN" in refused.json()["detail"]
    assert not any("/resolve/" in seen.path for seen in hub.seen)


def test_the_hub_token_opens_gated_models_and_never_leaves_the_hub(team_with, hub):
    team = team_with(LANNER_HUB_URL=hub.url, LANNER_HUB_TOKEN=hub.token)
    assert team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama-gated"}).status_code == 202
    assert wait_for_download(team.alice, "lanner-test/tiny-llama-gated")["status"] == "done"
    resolves = [seen for seen in hub.seen if "/resolve/" in seen.path]
    cdn = [seen for seen in hub.seen if seen.path.startswith("/cdn/")]
    assert resolves and all(seen.authorization == f"Bearer {hub.token}" for seen in resolves)
    assert cdn and all(seen.host.startswith("localhost") and seen.authorization is None for seen in cdn)


def test_what_cannot_be_downloaded_is_refused_with_a_reason(team_and_hub):
    team, hub = team_and_hub
    missing = team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/nothing-here"})
    assert missing.status_code == 404 and "not on the hub" in missing.json()["detail"]
    no_weights = team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/no-weights"})
    assert no_weights.status_code == 422 and "weights" in no_weights.json()["detail"]
    for bad in ("../../etc", "no-slash", "a/b/c", "org/../x"):
        assert team.alice.post("/api/models/downloads", json={"repo_id": bad}).status_code == 422, bad
    assert team.anonymous.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama"}).status_code == 401
    assert team.anonymous.get("/api/models/downloads").status_code == 401
    assert team.alice.get("/api/models/downloads").json() == []


def test_a_download_that_would_fill_the_disk_is_refused(team_with, hub):
    team = team_with(LANNER_HUB_URL=hub.url, LANNER_MIN_FREE_BYTES=str(2**62))
    no_room = team.alice.post("/api/models/downloads", json={"repo_id": "lanner-test/tiny-llama"})
    assert no_room.status_code == 507 and "disk space" in no_room.json()["detail"]
    assert not (team.api.settings.models_dir / "lanner-test").exists()
    assert not any("/resolve/" in seen.path for seen in hub.seen)
    assert team.alice.get("/api/models/downloads").json() == []


def test_without_the_hub_search_and_download_answer_offline(team):
    # The team's API points at 127.0.0.1:9, where nothing listens: a box without network.
    for response in (team.bob.get("/api/models/search", params={"q": "llama"}),
                     team.bob.post("/api/models/downloads", json={"repo_id": "Qwen/Qwen2.5-0.5B-Instruct"})):
        assert response.status_code == 503, response.text
        assert response.json()["detail"].startswith("offline") and "built-in model" in response.json()["detail"]
    assert team.bob.get("/api/models/downloads").json() == []


def test_the_real_hub_is_unreachable_here_and_downloads_say_so(team_with):
    team = team_with(LANNER_HUB_URL="https://huggingface.co", LANNER_HUB_TIMEOUT_S="2")
    response = team.bob.post("/api/models/downloads", json={"repo_id": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    assert response.status_code == 503 and "offline" in response.json()["detail"]
