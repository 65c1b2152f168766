"""Jobs on the Llama-3 8B shape through the studio on the GPU: LoRA and QLoRA queued at once run one
after the other with what the job page needs on their streams, their memory estimates close to the
measured peaks; a cancel frees the GPU."""
from __future__ import annotations

import time

import pytest

from gpu_helpers import gpu_memory_used_bytes, long_rows

pytestmark = pytest.mark.timeout(600)
def spec(model, dataset_id: int, method: str, steps: int, **hyperparameters) -> dict:
    return {"method": method, "model": str(model), "dataset_id": dataset_id, "name": f"{method} 8B",
            "hyperparameters": {"max_steps": steps, "batch_size": 4, "gradient_accumulation": 1, "max_seq_len": 2048,
                                "save_steps": 10_000, "before_after_eval": False, "warmup_ratio": 0.0,
                                **hyperparameters},
            "lora": {"rank": 16, "alpha": 32, "target_modules": "all-linear"}}


def measured_peak(studio, job_id: int) -> int:
    return max(sample["memory_used_bytes"] for sample in studio.of_type(job_id, "device"))


def test_lora_and_qlora_queued_at_once_run_in_turn_with_live_metrics(studio, llama3_8b_dir):
    dataset = studio.upload("long.jsonl", long_rows(48))
    idle = gpu_memory_used_bytes()
    lora = studio.request("POST", "/api/jobs", spec(llama3_8b_dir, dataset, "lora", 12))
    qlora = studio.request("POST", "/api/jobs", spec(llama3_8b_dir, dataset, "qlora", 12))
    assert studio.job(qlora["id"])["status"] == "queued"
    lora, qlora = studio.wait(lora["id"], 420), studio.wait(qlora["id"], 420)
    for job in (lora, qlora):
        assert job["status"] == "succeeded", (job, studio.logs(job["id"])[-20:])
    assert qlora["started_at"] >= lora["finished_at"], "two jobs ran on one GPU at once"

    for job in (lora, qlora):
        metrics = [m for m in studio.of_type(job["id"], "metric") if "loss" in m]
        assert len(metrics) >= 10 and all(m["loss"] > 0 and m["tokens_per_second"] > 0 for m in metrics[1:])
        devices = studio.of_type(job["id"], "device")
        assert devices and all(d["kind"] == "cuda" for d in devices)
        assert max(d["gpu_utilization_percent"] for d in devices) > 50
        logs = "\n".join(studio.logs(job["id"]))
        assert "lanner.kernels: on for llama" in logs, logs
        assert "Memory engine (lanner.kernels): on" in logs and "plan" in logs.lower(), logs
        assert "bfloat16" in logs, logs  # bf16 picked by "auto" on a GPU that has it
        peak = measured_peak(studio, job["id"]) - idle
        estimate = job["memory_estimate_bytes"]
        print(f"{job['method']}: estimate {estimate / 2**30:.2f} GiB, measured peak {peak / 2**30:.2f} GiB "
              f"({estimate / peak - 1:+.1%})")
        assert abs(estimate - peak) <= 0.15 * peak, (job["method"], estimate, peak)


def test_cancel_frees_the_gpu_within_ten_seconds(studio, llama3_8b_dir):
    dataset = studio.upload("long-cancel.jsonl", long_rows(16))
    idle = gpu_memory_used_bytes()
    job = studio.request("POST", "/api/jobs", spec(llama3_8b_dir, dataset, "lora", 1000))
    studio.wait(job["id"], 300, until=lambda j: j["step"] >= 2 or j["status"] != "queued" and j["status"] != "running")
    assert gpu_memory_used_bytes() > idle + 10 * 2**30  # the 8B model is on the GPU
    asked = time.monotonic()
    studio.request("POST", f"/api/jobs/{job['id']}/cancel")
    while gpu_memory_used_bytes() > idle + 2**30 and time.monotonic() - asked < 10:
        time.sleep(0.2)
    freed_after = time.monotonic() - asked
    assert gpu_memory_used_bytes() <= idle + 2**30, f"GPU still holds {gpu_memory_used_bytes() - idle} bytes"
    print(f"GPU free {freed_after:.1f} s after the cancel")
    assert studio.wait(job["id"], 30)["status"] == "cancelled"
