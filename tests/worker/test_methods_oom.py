"""Out of memory, for real on the CPU: the job's memory_limit_mb caps the address space the training
steps may add (RLIMIT_AS), so an allocation over it fails inside torch as on a full GPU. At sequence
length 128 a step of SmolLM2 LoRA here adds about 1.2 GB at micro-batch 4 and 0.7 GB at micro-batch
2, so a 950 MB cap fits the second and not the first."""
from __future__ import annotations

import pytest

from training_run import logs, run_train_process, step_metrics, trained

WORDS = "the quick brown fox jumps over the lazy dog while the river keeps running past the old mill".split()
# 16 rows that all fill the 128 tokens: every micro-batch has the same size, and so the same peak.
LONG_ROWS = [{"instruction": f"Row {i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(70)),
              "output": " ".join(WORDS[(2 * i + k) % len(WORDS)] for k in range(40))} for i in range(16)]
LONG = {"max_seq_len": 128, "batch_size": 4, "gradient_accumulation": 1, "max_steps": 2, "save_steps": 1,
        "before_after_eval": False}  # hyperparameters
FITS_MICRO_BATCH_2_ONLY = 950


def test_out_of_memory_retries_from_the_last_checkpoint_at_half_the_micro_batch(studio):
    dataset = studio.dataset("long.jsonl", LONG_ROWS)
    parent = studio.job(dataset, {"hyperparameters": LONG})
    trained(studio, parent)
    uncapped = step_metrics(studio, parent)

    # The same run continued from its checkpoint-1 under the cap: step 2 runs out of memory at
    # micro-batch 4, and the retry starts again from checkpoint-1 at 2 x 2.
    job_id = studio.job(dataset, {"hyperparameters": {**LONG, "memory_limit_mb": FITS_MICRO_BATCH_2_ONLY}}, parent_job_id=parent,
                        resume_from="checkpoint-1")
    trained(studio, job_id)
    assert ("Out of memory at step 2 with micro-batch 4 x 1 accumulation steps and sequence length 128; retrying "
            "once from checkpoint-1 with micro-batch 2 x 2 accumulation steps, the same 4 samples per optimizer step"
            in logs(studio, job_id))
    metrics = step_metrics(studio, job_id)
    assert [m["step"] for m in metrics] == [2]
    # Same samples, same effective batch: the loss curve continues the uncapped one.
    assert metrics[0]["loss"] == pytest.approx(uncapped[1]["loss"], rel=1e-4)
    assert metrics[0]["learning_rate"] == uncapped[1]["learning_rate"]
    assert (studio.data_dir / "artifacts" / str(job_id) / "adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("config, reason", [
    ({"memory_limit_mb": 150}, "also after the automatic retry (first at micro-batch 4 x 1)"),
    ({"memory_limit_mb": FITS_MICRO_BATCH_2_ONLY, "oom_retry": False}, "automatic retry is off (oom_retry)"),
])
def test_out_of_memory_that_the_retry_cannot_fix_fails_with_the_reason(studio, config, reason):
    job_id = studio.job(studio.dataset("long.jsonl", LONG_ROWS), {"hyperparameters": {**LONG, **config}})
    done = run_train_process(studio, job_id)
    assert done.returncode == 1, done.stderr[-3000:]
    error = studio.get_job(job_id).error
    micro_batch = "2 x 2" if config.get("oom_retry", True) else "4 x 1"
    assert error.startswith(f"Out of memory at step 1 with micro-batch {micro_batch} accumulation steps and "
                            f"sequence length 128; {reason}. Try "), error
    assert "a higher memory_limit_mb" in error
    assert not step_metrics(studio, job_id)
