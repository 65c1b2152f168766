"""The built-in SmolLM2 (or, where only one call could carry the bundle, random weights of its
shape: conftest.small_model) through the studio on the GPU: a LoRA job exported to merged and GGUF files
that pass their checks and then answered from in a GPU chat session; DPO; a full fine-tune in bf16;
a worker killed mid-job and the job resumed from its checkpoint without a person; an out-of-memory
step under a memory cap retried or failed in words."""
from __future__ import annotations

import json

import psutil
import pytest

from gpu_helpers import gpu_memory_used_bytes, long_rows

pytestmark = pytest.mark.timeout(600)


def qa_rows(count: int) -> list[dict]:
    return [{"instruction": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."} for i in range(count)]


def preference_rows(count: int) -> list[dict]:
    return [{"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}.", "rejected": f"{2 * i + 1}, I think."}
            for i in range(count)]


def job(studio, model: str, dataset: int, method: str = "lora", steps: int = 20, **fields) -> dict:
    hyperparameters = {"max_steps": steps, "batch_size": 8, "gradient_accumulation": 1, "max_seq_len": 256,
                       "save_steps": 10_000, "before_after_eval": False, **fields.pop("hyperparameters", {})}
    return studio.request("POST", "/api/jobs", {"method": method, "model": model, "dataset_id": dataset,
                                                "hyperparameters": hyperparameters, **fields})


@pytest.fixture(scope="module")
def qa_dataset(studio) -> int:
    return studio.upload("qa.jsonl", qa_rows(64))


def test_a_gpu_trained_adapter_exports_verified_files_and_answers_in_a_gpu_chat(studio, qa_dataset, small_model):
    trained = studio.wait(job(studio, small_model, qa_dataset)["id"], 300)
    assert trained["status"] == "succeeded", studio.logs(trained["id"])[-20:]
    assert trained["device"]["kind"] == "cuda"

    export = studio.request("POST", f"/api/jobs/{trained['id']}/export",
                            {"adapter": True, "merged": True, "merged_dtype": "bfloat16", "gguf_types": ["q8_0"],
                             "verify": True})
    export = studio.wait(export["id"], 420)
    assert export["status"] == "succeeded", (export["error"], studio.logs(export["id"])[-20:])
    checks = studio.of_type(export["id"], "verification")
    assert checks, "no verification on the export's stream"
    kinds = {artifact["kind"] for artifact in studio.request("GET", f"/api/jobs/{export['id']}/artifacts")}
    assert {"adapter", "merged", "gguf"} <= kinds, kinds

    chat = studio.request("POST", f"/api/playground/jobs/{trained['id']}/gpu-session", {})
    from websockets.sync.client import connect

    url = studio.url.replace("http://", "ws://") + f"/ws/playground?token={studio.token}"
    with connect(url, open_timeout=10) as socket:
        socket.send(json.dumps({"type": "generate", "id": 1, "job_id": trained["id"], "gpu_session": chat["id"],
                                "chats": {"tuned": [{"role": "user", "content": "What is 3 plus 3?"}]},
                                "max_tokens": 16, "temperature": 0.0}))
        tokens, done = [], None
        while done is None:
            message = json.loads(socket.recv(timeout=300))
            assert message["type"] != "error", message
            if message["type"] == "token":
                tokens.append(message["text"])
            elif message["type"] == "done":
                done = message
    assert tokens and done["model"] == "tuned"
    session = studio.job(chat["id"])
    assert session["status"] == "running" and session["device"]["kind"] == "cuda", session
    studio.request("POST", f"/api/playground/gpu-sessions/{chat['id']}/close")
    assert studio.wait(chat["id"], 60)["status"] in ("succeeded", "cancelled")


def test_dpo_on_the_gpu(studio, small_model):
    dataset = studio.upload("pairs.jsonl", preference_rows(48))
    done = studio.wait(job(studio, small_model, dataset, "dpo", 12)["id"], 300)
    assert done["status"] == "succeeded", studio.logs(done["id"])[-20:]
    metrics = [m for m in studio.of_type(done["id"], "metric") if "loss" in m]
    assert len(metrics) >= 10 and all(m["loss"] > 0 for m in metrics)


def test_a_full_fine_tune_in_bf16(studio, qa_dataset, small_model):
    done = studio.wait(job(studio, small_model, qa_dataset, "full", 12, hyperparameters={"precision": "bf16"})["id"], 300)
    assert done["status"] == "succeeded", studio.logs(done["id"])[-20:]
    assert "bfloat16" in "\n".join(studio.logs(done["id"]))
    kinds = {artifact["kind"] for artifact in studio.request("GET", f"/api/jobs/{done['id']}/artifacts")}
    assert "model" in kinds


def _celery_workers(up_pid: int) -> list[psutil.Process]:
    return [child for child in psutil.Process(up_pid).children() if "celery" in " ".join(child.cmdline())]


def test_a_killed_worker_s_job_resumes_from_its_checkpoint(studio, gpu_stack, qa_dataset, small_model):
    started = job(studio, small_model, qa_dataset, steps=200, requeue_on_worker_loss=True, hyperparameters={"save_steps": 20})
    studio.wait(started["id"], 300, until=lambda j: j["step"] >= 30 or j["status"] in ("succeeded", "failed"))
    assert studio.of_type(started["id"], "checkpoint"), "no checkpoint before the kill"
    for worker in _celery_workers(gpu_stack.process.pid):
        worker.kill()
    done = studio.wait(started["id"], 420)
    assert done["status"] == "succeeded", (done["error"], studio.logs(done["id"])[-20:])
    assert done["resume_from"] and done["resume_from"].startswith("checkpoint-")
    statuses = [event["status"] for event in studio.of_type(done["id"], "status")]
    assert statuses[-3:] == ["queued", "running", "succeeded"], statuses


def test_out_of_memory_under_a_memory_cap_is_retried_then_reported_in_words(studio, small_model):
    idle = gpu_memory_used_bytes()
    dataset = studio.upload("long.jsonl", long_rows(64))
    done = studio.wait(job(studio, small_model, dataset, steps=4, hyperparameters={
        "batch_size": 64, "max_seq_len": 4096, "gradient_checkpointing": False, "memory_limit_mb": 3000})["id"], 300)
    logs = "\n".join(studio.logs(done["id"]))
    assert "Out of memory" in (done["error"] or "") + logs, logs
    assert "retrying once" in logs, logs
    if done["status"] == "failed":
        assert "Out of memory" in done["error"] and "micro-batch" in done["error"], done["error"]
    assert gpu_memory_used_bytes() <= idle + 2**30
