"""Reward-model jobs (method reward) through the API, and a trained one named as a GRPO reward function:
what is refused, in words, and what is queued."""
from __future__ import annotations

import json

import pytest

from lanner.core import db
from lanner.core.models import Artifact, ArtifactKind, JobStatus

from backend_helpers import CHAT_ROWS, MODEL, PREFERENCE_ROWS, field_errors, set_status, submit, upload

PROMPTS = "".join(json.dumps({"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)}) + "\n" for i in range(3))


def grpo_with_reward_model(client, dataset_id: int, job_id: int):
    return client.post("/api/jobs", json={"method": "grpo", "model": MODEL, "dataset_id": dataset_id, "grpo": {
        "reward_functions": [{"kind": "reward_model", "job_id": job_id, "weight": 0.5}, {"kind": "exact_match"}]}})


@pytest.fixture
def reward_job(team_on_each_database, wakes):
    """A reward job of alice's on preference pairs, queued, and a prompt dataset of bob's, on SQLite and
    on PostgreSQL."""
    team = team_on_each_database
    pairs = upload(team.alice, "pairs.jsonl", PREFERENCE_ROWS).json()["id"]
    job = submit(team.alice, pairs, method="reward", lora={"rank": 4})
    assert job.status_code == 201, job.text
    return job.json(), upload(team.bob, "prompts.jsonl", PROMPTS).json()["id"]


def saved(team, job_id: int) -> None:
    """The job succeeded with its adapter, as the training process leaves it."""
    set_status(team.api, job_id, JobStatus.succeeded)
    folder = team.api.settings.data_dir / "artifacts" / str(job_id) / "adapter"
    folder.mkdir(parents=True)
    with db.session_factory(team.api.settings.database_url)() as session:
        session.add(Artifact(job_id=job_id, kind=ArtifactKind.adapter, name="adapter",
                             path=f"artifacts/{job_id}/adapter", size_bytes=1))
        session.commit()


def test_a_reward_job_trains_on_preference_pairs_with_or_without_lora(team, wakes):
    chat = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    refused = submit(team.alice, chat, method="reward")
    assert field_errors(refused)[("dataset_id",)] == (f"reward needs a preference dataset (prompt, chosen, "
                                                      f"rejected); dataset {chat} is messages")
    packed = submit(team.alice, chat, method="reward", hyperparameters={"packing": True})
    assert "packing does not apply to reward: preference pairs are never packed" in packed.text
    pairs = upload(team.alice, "pairs.jsonl", PREFERENCE_ROWS).json()["id"]
    whole = submit(team.alice, pairs, method="reward").json()["config"]
    assert whole["lora"] is None and whole["hyperparameters"]["learning_rate"] == 1e-5
    adapter = submit(team.alice, pairs, method="reward", lora={"rank": 4}).json()["config"]
    assert adapter["lora"]["rank"] == 4


def test_a_grpo_reward_model_must_be_a_succeeded_reward_job(team_on_each_database, reward_job):
    team = team_on_each_database
    job, prompts = reward_job
    missing = grpo_with_reward_model(team.bob, prompts, 9999)
    assert field_errors(missing)[("grpo",)] == "reward_model: there is no training job 9999"
    lora = submit(team.alice, upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]).json()["id"]
    assert field_errors(grpo_with_reward_model(team.bob, prompts, lora))[("grpo",)] == (
        f"reward_model: job {lora} is a lora job, not a reward model (method reward)")
    assert field_errors(grpo_with_reward_model(team.bob, prompts, job["id"]))[("grpo",)] == (
        f"reward_model: job {job['id']} is queued; only a succeeded reward job scores completions")
    set_status(team.api, job["id"], JobStatus.succeeded)
    assert field_errors(grpo_with_reward_model(team.bob, prompts, job["id"]))[("grpo",)] == (
        f"reward_model: job {job['id']}'s trained model was deleted")


def test_a_succeeded_reward_job_is_a_grpo_reward_of_anyone_and_is_never_exported_or_chatted_with(
        team_on_each_database, reward_job):
    team = team_on_each_database
    job, prompts = reward_job
    saved(team, job["id"])
    grpo = grpo_with_reward_model(team.bob, prompts, job["id"])  # bob's GRPO job, alice's reward model
    assert grpo.status_code == 201, grpo.text
    assert grpo.json()["config"]["grpo"]["reward_functions"][0] == {"kind": "reward_model", "job_id": job["id"],
                                                                    "weight": 0.5, "name": None, "column": None,
                                                                    "tolerance": None, "pattern": None,
                                                                    "max_chars": None, "json_schema": None,
                                                                    "source": None}
    # Its memory estimate counts the reward model it loads (the reward job's base, the built-in model here).
    spec = {"method": "grpo", "model": MODEL, "dataset_id": prompts, "grpo": {"reward_functions": [
        {"kind": "reward_model", "job_id": job["id"]}, {"kind": "exact_match"}]}}
    judged = team.bob.post("/api/jobs/estimate", json=spec).json()["estimate"]
    spec["grpo"]["reward_functions"] = [{"kind": "exact_match"}]
    plain = team.bob.post("/api/jobs/estimate", json=spec).json()["estimate"]
    assert judged["reward_models_bytes"] > 100 * 2**20 and plain["reward_models_bytes"] == 0
    assert judged["total_bytes"] - plain["total_bytes"] >= judged["reward_models_bytes"]
    assert team.bob.get(f"/api/jobs/{grpo.json()['id']}").json()["memory_estimate_bytes"] == judged["total_bytes"]
    exported = team.alice.post(f"/api/jobs/{job['id']}/export", json={"adapter": True})
    assert exported.status_code == 409 and "trained a reward model" in exported.json()["detail"]
    assert "vLLM's LoRA loader, which takes no score head" in exported.json()["detail"]
    chat = team.alice.get(f"/api/playground/jobs/{job['id']}")
    assert chat.status_code == 409 and "there is nothing to chat with" in chat.json()["detail"]
    lora = submit(team.alice, upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]).json()["id"]
    set_status(team.api, lora, JobStatus.succeeded)
    assert [listed["job_id"] for listed in team.alice.get("/api/playground/jobs").json()] == [lora]
    tried = team.bob.post("/api/rewards/test", json={"completions": ["4"], "reward_functions": [
        {"kind": "reward_model", "name": "judge", "job_id": job["id"]}]})
    assert tried.status_code == 422 and tried.json()["detail"].startswith(
        "judge: a trained reward model scores completions in the training process")
