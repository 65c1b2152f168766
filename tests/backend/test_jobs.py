"""Jobs: the validated spec, the queue (positions, moves, priorities), cancel, retry, clone, delete."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from lanner.core import db
from lanner.core.models import Artifact, Job, JobStatus
from lanner.core.streams import QUEUE_STREAM, job_stream, read_after

from backend_helpers import CHAT_ROWS, MODEL, PREFERENCE_ROWS, field_errors, set_status, submit, upload

@pytest.fixture
def chat(team):
    return upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]


def test_a_job_is_queued_with_defaults_and_wakes_the_workers(team_on_each_database, wakes):
    team = team_on_each_database
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    response = submit(team.alice, dataset_id)
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["status"] == "queued" and job["owner_id"] == team.ids["alice"] and job["queue_position"] == 1
    assert job["config"]["lora"] == {"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}
    assert job["config"]["hyperparameters"]["learning_rate"] == 2e-4 and job["config"]["preference"] is None
    assert job["name"] == "lora SmolLM2-135M-Instruct on chat"
    assert len(wakes) == 1
    events = read_after(team.api.redis, QUEUE_STREAM)
    assert [(kind, data["job_id"]) for _, kind, data in events] == [("added", job["id"])]
    assert team.bob.get(f"/api/jobs/{job['id']}").json()["id"] == job["id"]  # the team sees every job
    # Requeued after a lost worker by default; the option may be turned off (issue 24: it was refused once).
    assert job["config"]["requeue_on_worker_loss"] is True and job["requeues"] == 0
    kept = submit(team.alice, dataset_id, requeue_on_worker_loss=False)
    assert kept.status_code == 201, kept.text
    assert kept.json()["config"]["requeue_on_worker_loss"] is False


def test_the_real_wake_up_never_fails_without_a_worker(team, chat):
    assert submit(team.alice, chat).status_code == 201


@pytest.mark.parametrize("spec, field, words", [
    ({"method": "full", "lora": {"rank": 8}}, ("lora",), "do not apply to full"),
    ({"hyperparameters": {"learning_rate": 0}}, ("hyperparameters", "learning_rate"), "greater than 0"),
    ({"hyperparameters": {"learning_rate": -1e-4}}, ("hyperparameters", "learning_rate"), "greater than 0"),
    ({"hyperparameters": {"batch_size": 0}}, ("hyperparameters", "batch_size"), "greater than or equal to 1"),
    ({"hyperparameters": {"max_seq_len": 8}}, ("hyperparameters", "max_seq_len"), "greater than or equal to 16"),
    ({"hyperparameters": {"max_seq_len": 10**7}}, ("hyperparameters", "max_seq_len"), "less than or equal"),
    ({"hyperparameters": {"warmup_ratio": 1}}, ("hyperparameters", "warmup_ratio"), "less than 1"),
    ({"hyperparameters": {"epochs": 2, "momentum": 0.9}}, ("hyperparameters", "momentum"), "Extra inputs"),
    ({"method": "full", "hyperparameters": {"learning_rate": 0.01}}, ("hyperparameters",), "wreck"),
    ({"method": "sft"}, ("method",), "'lora'"),
    ({"model": "../../etc"}, ("model",), "hub id"),
    ({"model": "/no/such/model"}, ("model",), "no model folder"),
    ({"preference": {"beta": 0.1}}, ("preference",), "apply to dpo, orpo and kto"),
    ({"method": "qlora", "gpus": 0}, ("gpus",), "needs a GPU"),
    ({"method": "lora_fp8", "gpus": 0}, ("gpus",), "lora_fp8 needs a GPU with FP8 tensor cores (compute capability 8.9"),
    ({"lora": {"rank": 0}}, ("lora", "rank"), "greater than or equal to 1"),
    ({"method": "orpo", "hyperparameters": {"packing": True}}, ("hyperparameters",), "packing"),
    ({"preset": {}}, ("preset",), "'quick'"),
    ({"dataset_id": 2**40}, ("dataset_id",), "less than or equal"),
])
def test_impossible_specs_are_refused_with_a_message_per_field(spec, field, words):
    from fastapi.exceptions import RequestValidationError

    from lanner.backend.services.jobs import validate_spec

    with pytest.raises(RequestValidationError) as refused:
        validate_spec({"method": "lora", "model": MODEL, "dataset_id": 1, **spec})
    errors = {tuple(error["loc"][1:]): error["msg"] for error in refused.value.errors()}
    assert field in errors and words in errors[field], errors


def test_what_only_the_database_knows_is_refused_per_field_too(team, chat):
    for spec, field, words in [
        ({"dataset_id": 999}, ("dataset_id",), "no dataset 999"),
        ({"priority": 5}, ("priority",), "only admins"),
        ({"method": "dpo"}, ("dataset_id",), "needs a preference dataset"),
        ({"method": "kto"}, ("dataset_id",), "kto needs preference data"),
        ({"method": "full", "lora": {"rank": 8}}, ("lora",), "do not apply to full"),
    ]:
        errors = field_errors(submit(team.alice, chat, **spec))
        assert field in errors and words in errors[field], errors


def test_lora_targets_that_name_no_layer_of_the_model_are_refused_when_queued(team, chat, wakes, smollm2_dir):
    """Checked against the checkpoint's weight names (the built-in model once imported: here the test cache's
    import), not when the worker's PEFT fails after the wait in the queue."""
    from lanner.core.default_model import builtin_dir
    from lanner.core.spec import LORA_TARGET_CHOICES

    builtin_dir(team.api.settings.models_dir).symlink_to(smollm2_dir, target_is_directory=True)
    refused = field_errors(submit(team.alice, chat, lora={"target_modules": ["nonexistent_proj"]}))
    assert refused[("lora",)] == (
        "lora.target_modules: 'nonexistent_proj' names no layer of SmolLM2-135M-Instruct that LoRA can adapt; its "
        "linear and embedding layers are q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
        "embed_tokens, lm_head (or all-linear)")
    for junk in (["q_projx", "v_proj"], [""], ["input_layernorm"]):
        assert "that LoRA can adapt" in field_errors(submit(team.alice, chat, lora={"target_modules": junk}))[("lora",)]
    job = submit(team.alice, chat).json()["id"]
    clone = team.alice.post(f"/api/jobs/{job}/clone", json={"lora": {"target_modules": ["norm"]}})
    assert "'norm' names no layer" in field_errors(clone)[("lora",)]
    for targets in ("all-linear", ["q_proj", "v_proj"], *LORA_TARGET_CHOICES.values(), ["lm_head", "self_attn.o_proj"]):
        queued = submit(team.alice, chat, lora={"target_modules": targets})
        assert queued.status_code == 201, queued.text


def test_several_wrong_fields_are_all_reported(team, chat):
    errors = field_errors(submit(team.alice, chat, hyperparameters={"learning_rate": 0, "batch_size": 0}))
    assert {("hyperparameters", "learning_rate"), ("hyperparameters", "batch_size")} <= set(errors)


def test_presets_fill_what_the_spec_leaves_out(team, chat):
    job = submit(team.alice, chat, preset="quick", hyperparameters={"batch_size": 2}).json()
    hp = job["config"]["hyperparameters"]
    assert hp["epochs"] == 1 and hp["batch_size"] == 2 and hp["max_seq_len"] == 1024


def test_preference_methods_need_a_preference_dataset(team):
    pairs = upload(team.bob, "pairs.jsonl", PREFERENCE_ROWS).json()
    assert pairs["format"] == "preference"
    job = submit(team.bob, pairs["id"], method="dpo")
    assert job.status_code == 201, job.text
    assert job.json()["config"]["preference"]["beta"] == 0.1
    assert job.json()["config"]["hyperparameters"]["learning_rate"] == 5e-6


def test_list_filters_and_paginates(team_on_each_database, wakes):
    team = team_on_each_database
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    ids = [submit(team.alice, dataset_id, name=f"alice {i}").json()["id"] for i in range(3)]
    ids.append(submit(team.bob, dataset_id, name="bob 0", method="full").json()["id"])
    set_status(team.api, ids[0], JobStatus.failed)
    page = team.bob.get("/api/jobs", params={"limit": 2}).json()
    assert page["total"] == 4 and [job["id"] for job in page["items"]] == [ids[3], ids[2]]
    assert [job["id"] for job in team.bob.get("/api/jobs", params={"offset": 2, "limit": 2}).json()["items"]] == [ids[1], ids[0]]
    assert team.bob.get("/api/jobs", params={"mine": True}).json()["total"] == 1
    assert team.bob.get("/api/jobs", params={"owner_id": team.ids["alice"]}).json()["total"] == 3
    assert team.bob.get("/api/jobs", params={"status": ["failed"]}).json()["total"] == 1
    assert team.bob.get("/api/jobs", params={"status": ["queued", "failed"]}).json()["total"] == 4
    assert team.bob.get("/api/jobs", params={"method": "full"}).json()["total"] == 1
    assert team.bob.get("/api/jobs", params={"q": "ALICE"}).json()["total"] == 3
    assert team.bob.get("/api/jobs", params={"limit": 1000}).status_code == 422
    assert team.bob.get("/api/jobs", params={"status": "lost"}).status_code == 422
    assert team.bob.get("/api/jobs/999").status_code == 404


def test_queue_positions_follow_priority_then_order(team_on_each_database, wakes):
    team = team_on_each_database
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    a1, a2 = (submit(team.alice, dataset_id).json()["id"] for _ in range(2))
    b1 = submit(team.bob, dataset_id).json()["id"]
    urgent = submit(team.admin, dataset_id, priority=5).json()["id"]
    queue = team.bob.get("/api/queue").json()
    assert [job["id"] for job in queue["queued"]] == [urgent, a1, b1, a2]  # owners take turns in a band
    assert [job["queue_position"] for job in queue["queued"]] == [1, 2, 3, 4]

    moved = team.bob.post(f"/api/jobs/{b1}/move", json={"move": "top"})
    assert moved.status_code == 200 and moved.json()["queue_position"] == 2  # top of its band, not above priority 5
    assert [job["id"] for job in team.bob.get("/api/queue").json()["queued"]] == [urgent, b1, a1, a2]
    team.alice.post(f"/api/jobs/{a2}/move", json={"move": "up"})
    assert [job["id"] for job in team.bob.get("/api/queue").json()["queued"]] == [urgent, b1, a2, a1]
    team.alice.post(f"/api/jobs/{a2}/move", json={"position": 4})
    assert [job["id"] for job in team.bob.get("/api/queue").json()["queued"]] == [urgent, b1, a1, a2]
    team.alice.post(f"/api/jobs/{a2}/move", json={"position": 1})  # clamped to the top of its band
    assert [job["id"] for job in team.bob.get("/api/queue").json()["queued"]] == [urgent, a2, b1, a1]
    team.alice.post(f"/api/jobs/{a2}/move", json={"move": "bottom"})
    assert [job["id"] for job in team.bob.get("/api/queue").json()["queued"]] == [urgent, b1, a1, a2]

    assert team.bob.post(f"/api/jobs/{a1}/move", json={"move": "top"}).status_code == 403  # not bob's
    assert team.alice.post(f"/api/jobs/{a1}/move", json={"priority": 9}).status_code == 403  # admins only
    assert team.alice.post(f"/api/jobs/{a1}/move", json={"move": "up", "position": 1}).status_code == 422
    assert team.alice.post(f"/api/jobs/{a1}/move", json={}).status_code == 422
    assert team.admin.post(f"/api/jobs/{a1}/move", json={"priority": 9}).json()["queue_position"] == 1
    assert [job["id"] for job in team.bob.get("/api/queue").json()["queued"]] == [a1, urgent, b1, a2]
    events = [kind for _, kind, _ in read_after(team.api.redis, QUEUE_STREAM)]
    assert events.count("reordered") == 6


def test_estimated_start_comes_from_finished_jobs(team, chat, wakes):
    first = submit(team.alice, chat).json()
    assert first["estimated_start"] is None  # nothing has run yet
    done = submit(team.alice, chat).json()["id"]
    now = datetime.now(timezone.utc)
    set_status(team.api, done, JobStatus.succeeded, started_at=now - timedelta(minutes=10), finished_at=now)
    second = submit(team.alice, chat).json()
    assert second["queue_position"] == 2
    start = datetime.fromisoformat(second["estimated_start"])
    assert timedelta(minutes=9) < start - now < timedelta(minutes=11)


def test_cancel_a_queued_job_at_once_and_a_running_one_through_the_worker(team, chat, wakes):
    queued = submit(team.alice, chat).json()["id"]
    running = submit(team.alice, chat).json()["id"]
    set_status(team.api, running, JobStatus.running, started_at=datetime.now(timezone.utc))
    assert team.bob.post(f"/api/jobs/{queued}/cancel").status_code == 403
    cancelled = team.alice.post(f"/api/jobs/{queued}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert [kind for _, kind, _ in read_after(team.api.redis, job_stream(queued))] == ["status"]
    asked = team.alice.post(f"/api/jobs/{running}/cancel")
    assert asked.status_code == 202 and asked.json()["status"] == "running" and asked.json()["cancel_requested"]
    assert team.api.redis.get(f"lanner:job:{running}:cancel") == "1"
    assert team.alice.get(f"/api/jobs/{running}").json()["cancel_requested"] is True
    again = team.alice.post(f"/api/jobs/{queued}/cancel")
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    kinds = [kind for _, kind, _ in read_after(team.api.redis, QUEUE_STREAM)]
    assert kinds == ["added", "added", "cancelled"]


def test_retry_queues_a_copy_and_may_resume_from_a_checkpoint(team, chat, wakes):
    job = submit(team.alice, chat, name="run").json()["id"]
    assert team.alice.post(f"/api/jobs/{job}/retry").status_code == 409  # still queued
    set_status(team.api, job, JobStatus.failed, error="OOM")
    with db.session_factory(team.api.settings.database_url)() as session:
        session.add(Artifact(job_id=job, kind="checkpoint", name="checkpoint-100", path=f"artifacts/{job}/checkpoint-100"))
        session.commit()
    assert team.bob.post(f"/api/jobs/{job}/retry").status_code == 403
    missing = team.alice.post(f"/api/jobs/{job}/retry", json={"resume_from": "checkpoint-7"})
    assert ("resume_from",) in field_errors(missing)
    retried = team.alice.post(f"/api/jobs/{job}/retry", json={"resume_from": "checkpoint-100"})
    assert retried.status_code == 201, retried.text
    assert retried.json()["parent_job_id"] == job and retried.json()["resume_from"] == "checkpoint-100"
    assert team.admin.post(f"/api/jobs/{job}/retry").status_code == 201
    # a retry of the resumed retry starts over: checkpoint-100 is its parent's, not its own
    set_status(team.api, retried.json()["id"], JobStatus.failed, error="OOM")
    again = team.alice.post(f"/api/jobs/{retried.json()['id']}/retry")
    assert again.status_code == 201 and again.json()["resume_from"] is None
    # a new job has no checkpoint; a clone resumes only from one its source has
    assert ("resume_from",) in field_errors(submit(team.alice, chat, resume_from="checkpoint-100"))
    clone = team.alice.post(f"/api/jobs/{job}/clone", json={"resume_from": "checkpoint-7"})
    assert ("resume_from",) in field_errors(clone)
    clone = team.alice.post(f"/api/jobs/{job}/clone", json={"resume_from": "checkpoint-100"})
    assert clone.status_code == 201 and clone.json()["resume_from"] == "checkpoint-100"


def test_clone_with_changes(team, chat, wakes):
    original = submit(team.alice, chat, hyperparameters={"learning_rate": 1e-4, "epochs": 2}).json()
    clone = team.bob.post(f"/api/jobs/{original['id']}/clone", json={"hyperparameters": {"epochs": 4}})
    assert clone.status_code == 201, clone.text
    hp = clone.json()["config"]["hyperparameters"]
    assert clone.json()["owner_id"] == team.ids["bob"] and clone.json()["parent_job_id"] == original["id"]
    assert hp["epochs"] == 4 and hp["learning_rate"] == 1e-4
    full = team.bob.post(f"/api/jobs/{original['id']}/clone", json={"method": "full"})
    assert full.status_code == 201 and full.json()["config"]["lora"] is None
    assert full.json()["config"]["hyperparameters"]["learning_rate"] == 2e-5
    wrong = team.bob.post(f"/api/jobs/{original['id']}/clone", json={"hyperparameters": {"batch_size": -1}})
    assert ("hyperparameters", "batch_size") in field_errors(wrong)
    assert team.bob.post("/api/jobs/999/clone", json={}).status_code == 404


def test_delete_removes_the_job_its_artifacts_and_their_files(team_on_each_database, wakes):
    team = team_on_each_database
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job = submit(team.alice, dataset_id).json()["id"]
    folder = team.api.settings.artifacts_dir / str(job)
    (folder / "adapter").mkdir(parents=True)
    (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    outside = team.api.settings.data_dir.parent / "keep.txt"
    outside.write_text("not Lanner's")
    with db.session_factory(team.api.settings.database_url)() as session:
        session.add(Artifact(job_id=job, kind="adapter", name="adapter", path=f"artifacts/{job}/adapter"))
        session.add(Artifact(job_id=job, kind="checkpoint", name="evil", path="../keep.txt"))
        session.commit()
    set_status(team.api, job, JobStatus.running)
    assert team.alice.delete(f"/api/jobs/{job}").status_code == 409
    set_status(team.api, job, JobStatus.succeeded)
    assert team.bob.delete(f"/api/jobs/{job}").status_code == 403
    assert team.alice.delete(f"/api/jobs/{job}").status_code == 204
    assert not folder.exists() and outside.read_text() == "not Lanner's"
    assert team.alice.get(f"/api/jobs/{job}").status_code == 404
    assert team.alice.delete(f"/api/jobs/{job}").status_code == 404
    other = submit(team.bob, dataset_id).json()["id"]
    assert team.admin.delete(f"/api/jobs/{other}").status_code == 204  # admins delete anyone's


def test_the_cancel_key_is_the_one_the_worker_reads():
    from lanner.core.messages import signals
    from lanner.backend.services import jobs

    assert jobs.cancel_key is signals.cancel_key and signals.cancel_key(7) == "lanner:job:7:cancel"


def test_metrics_and_device_samples_page_through_the_saved_history(team_on_each_database, wakes):
    from lanner.core.models import DeviceSample, JobMetric

    team = team_on_each_database
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job = submit(team.alice, dataset_id).json()["id"]
    with db.session_factory(team.api.settings.database_url)() as session:
        session.add_all(JobMetric(job_id=job, step=step, values={"loss": 3.0 - step / 10}) for step in range(1, 6))
        session.add_all(DeviceSample(job_id=job, values={"utilization": u}) for u in (10, 90))
        session.commit()
    first = team.bob.get(f"/api/jobs/{job}/metrics", params={"limit": 3}).json()
    assert [m["step"] for m in first] == [1, 2, 3] and first[0]["values"]["loss"] == 2.9
    rest = team.bob.get(f"/api/jobs/{job}/metrics", params={"after_step": first[-1]["step"]}).json()
    assert [m["step"] for m in rest] == [4, 5]
    samples = team.bob.get(f"/api/jobs/{job}/device-samples").json()
    assert [s["values"]["utilization"] for s in samples] == [10, 90]
    assert team.bob.get(f"/api/jobs/{job}/device-samples", params={"after_id": samples[0]["id"]}).json()[0]["values"] == {"utilization": 90}
    assert team.bob.get("/api/jobs/999/metrics").status_code == 404
    assert team.anonymous.get(f"/api/jobs/{job}/metrics").status_code == 401
    assert team.bob.get(f"/api/jobs/{job}/metrics", params={"limit": 10**6}).status_code == 422


def test_the_config_carries_the_options_the_training_process_reads(team, wakes):
    from lanner.core.spec import JobSpec
    from lanner.worker.training.options import training_options

    pairs = upload(team.alice, "pairs.jsonl", PREFERENCE_ROWS).json()["id"]
    job = submit(team.alice, pairs, method="dpo", lora={"rank": 8, "alpha": 16},
                 hyperparameters={"batch_size": 2, "gradient_accumulation": 8, "max_seq_len": 512, "max_steps": 30,
                                  "precision": "bf16", "learning_rate": 1e-5, "use_kernels": False,
                                  "oom_retry": False},
                 preference={"beta": 0.2}).json()
    options = training_options(JobSpec.model_validate(job["config"]))
    assert (options.use_kernels, options.oom_retry) == (False, False)
    assert (options.per_device_train_batch_size, options.gradient_accumulation_steps, options.max_seq_length) == (2, 8, 512)
    assert (options.max_steps, options.learning_rate, options.dtype) == (30, 1e-5, "bfloat16")
    assert (options.lora_r, options.lora_alpha, options.beta) == (8, 16, 0.2)
    clone = team.alice.post(f"/api/jobs/{job['id']}/clone", json={"lora": {"rank": 4}}).json()
    assert training_options(JobSpec.model_validate(clone["config"])).lora_r == 4


def test_jobs_carry_a_memory_estimate_and_specs_can_be_estimated_alone(team, chat, wakes):
    job = submit(team.alice, chat).json()
    assert job["memory_estimate_bytes"] > 134_000_000  # at least the built-in model's weights

    def estimate(**spec):
        response = team.bob.post("/api/jobs/estimate", json={"method": "lora", "model": MODEL, "dataset_id": 1, **spec})
        assert response.status_code == 200, response.text
        return response.json()

    eight_b = "meta-llama/Llama-3.1-8B-Instruct"
    lora, qlora, full = (estimate(model=eight_b, method=m)["estimate"]["total_bytes"] for m in ("lora", "qlora", "full"))
    assert qlora < lora < full
    assert estimate(model="someone/unknown-model")["estimate"] is None
    local = team.api.settings.models_dir / "tiny"
    local.mkdir(parents=True)
    (local / "config.json").write_text('{"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2, '
                                       '"vocab_size": 1000, "num_attention_heads": 4, "num_key_value_heads": 4}')
    small = estimate(model=str(local), gpus=0)
    assert small["device"] == "cpu" and small["estimate"]["activations_bytes"] > 0
    longer = estimate(model=str(local), gpus=0, hyperparameters={"max_seq_len": 8192})
    assert longer["estimate"]["total_bytes"] > small["estimate"]["total_bytes"]
    assert team.anonymous.post("/api/jobs/estimate", json={}).status_code == 401


def test_an_estimate_sizes_a_batch_by_the_datasets_longest_row(team, allowed_smollm2, wakes):
    """A batch is padded to its longest row: a dataset of short rows needs far less than max_seq_len."""
    model = str(allowed_smollm2)
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS, model=model).json()
    longest = dataset["report"]["token_stats"]["max"]
    spec = {"method": "lora", "model": model, "gpus": 0, "dataset_id": dataset["id"]}
    job = submit(team.alice, dataset["id"], model=model, gpus=0).json()
    measured = team.bob.post("/api/jobs/estimate", json=spec).json()["estimate"]
    unmeasured = team.bob.post("/api/jobs/estimate", json={**spec, "dataset_id": 99}).json()["estimate"]
    assert job["memory_estimate_bytes"] == measured["total_bytes"] < unmeasured["total_bytes"] / 4
    one_row = {**spec, "dataset_id": 99, "hyperparameters": {"max_seq_len": longest}}
    assert team.bob.post("/api/jobs/estimate", json=one_row).json()["estimate"] == measured


def test_an_odd_local_config_gives_no_estimate_but_the_job_is_queued(team, chat, wakes):
    odd = team.api.settings.models_dir / "odd"
    odd.mkdir(parents=True)
    (odd / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 0}')
    assert team.bob.post("/api/jobs/estimate", json={"method": "lora", "model": str(odd), "dataset_id": 1}).json()["estimate"] is None
    job = submit(team.bob, chat, model=str(odd))
    assert job.status_code == 201 and job.json()["memory_estimate_bytes"] is None


def add_adapter(team, job: int) -> None:
    with db.session_factory(team.api.settings.database_url)() as session:
        session.add(Artifact(job_id=job, kind="adapter", name="adapter", path=f"artifacts/{job}/adapter"))
        session.commit()


def test_export_queues_an_export_job_of_a_finished_training_job(team, chat, wakes):
    job = submit(team.alice, chat, name="run").json()["id"]
    assert team.alice.post(f"/api/jobs/{job}/export").status_code == 409  # not finished
    set_status(team.api, job, JobStatus.succeeded)
    no_adapter = team.alice.post(f"/api/jobs/{job}/export")
    assert no_adapter.status_code == 409 and "no adapter" in no_adapter.json()["detail"]
    add_adapter(team, job)
    nothing = team.alice.post(f"/api/jobs/{job}/export", json={"adapter": False, "merged": False, "gguf_types": []})
    assert ("gguf_types",) in field_errors(nothing)
    assert team.alice.post(f"/api/jobs/{job}/export", json={"gguf_types": ["q9_9"]}).status_code == 422
    export = team.bob.post(f"/api/jobs/{job}/export", json={"gguf_types": ["q4_k_m"], "merged": False})
    assert export.status_code == 201, export.text
    body = export.json()
    assert body["kind"] == "export" and body["parent_job_id"] == job and body["owner_id"] == team.ids["bob"]
    assert body["config"]["export"]["gguf_types"] == ["q4_k_m"] and body["status"] == "queued"
    assert team.bob.post(f"/api/jobs/{body['id']}/clone").status_code == 409  # an export is not cloned
    assert team.bob.post(f"/api/jobs/{body['id']}/export").status_code == 409


def test_what_needs_llama_cpp_is_refused_in_words_while_it_is_built(team, chat, wakes, llama_cpp_state):
    job = submit(team.alice, chat, name="run").json()["id"]
    set_status(team.api, job, JobStatus.succeeded)
    add_adapter(team, job)
    llama_cpp_state("building")
    k_quant = team.alice.post(f"/api/jobs/{job}/export", json={"gguf_types": ["q4_k_m"], "verify": False})
    assert k_quant.status_code == 409, k_quant.text
    assert k_quant.json()["detail"].startswith("This export (GGUF q4_k_m) needs llama.cpp. llama.cpp is still being "
                                               "built (since ")
    checked = team.alice.post(f"/api/jobs/{job}/export").json()["detail"]  # the default checks its q8_0 GGUF
    assert "(the check of the GGUF files) needs llama.cpp" in checked and "ready in a few minutes" in checked
    without = team.alice.post(f"/api/jobs/{job}/export", json={"gguf_types": ["f16", "q8_0"], "verify": False})
    assert without.status_code == 201, without.text
    assert team.alice.post(f"/api/jobs/{job}/export", json={"gguf_types": []}).status_code == 201
    llama_cpp_state("failed")
    failed = team.alice.post(f"/api/jobs/{job}/export", json={"gguf_types": ["q6_k"]}).json()["detail"]
    assert "llama.cpp's build failed" in failed and "llama-cpp-build.log" in failed
    llama_cpp_state("ready")
    assert team.alice.post(f"/api/jobs/{job}/export", json={"gguf_types": ["q4_k_m"]}).status_code == 201

