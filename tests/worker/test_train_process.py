"""The training process on its own (no Celery): a real LoRA SFT of SmolLM2-135M on the CPU."""
from __future__ import annotations

from sqlalchemy import select

from lanner.core.models import Artifact, JobMetric
from lanner.core.streams import job_stream, read_after

from training_run import run_train_process
from worker_helpers import qa_rows


def test_lora_sft_trains_streams_and_saves(studio):
    rows = qa_rows(24) + ['{"instruction": "broken', {"instruction": "no answer"}]
    job_id = studio.job(studio.dataset("qa.jsonl", rows), {"hyperparameters": {"eval_steps": 4}})
    done = run_train_process(studio, job_id)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    events = read_after(studio.redis, job_stream(job_id), count=10_000)
    metrics = [data for _, kind, data in events if kind == "metric" and "loss" in data]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for m in metrics:
        assert m["loss"] > 0 and m["learning_rate"] >= 0 and m["grad_norm"] >= 0 and m["epoch"] > 0
        assert m["step_time"] > 0 and m["samples_per_second"] > 0 and m["tokens_per_second"] > 0
        assert m["total_steps"] == 4
    evals = [data for _, kind, data in events if kind == "metric" and "eval_loss" in data]
    assert [e["step"] for e in evals] == [4]
    dataset = next(data for _, kind, data in events if kind == "dataset")
    assert (dataset["format"], dataset["rows"], dataset["usable_rows"], dataset["bad_row_count"]) == ("alpaca", 26, 24, 2)
    assert [bad["line"] for bad in dataset["bad_rows"]] == [25, 26]
    logs = [data["message"] for _, kind, data in events if kind == "log"]
    assert any("2 skipped (first: line 25: malformed JSON" in line for line in logs), logs
    assert any(line.startswith("lanner.kernels: ") for line in logs), logs

    job = studio.get_job(job_id)
    assert (job.step, job.total_steps) == (4, 4)
    with studio.sessions() as session:
        stored = session.execute(select(JobMetric).where(JobMetric.job_id == job_id).order_by(JobMetric.id)).scalars().all()
        assert [m.values["loss"] for m in stored if "loss" in m.values] == [m["loss"] for m in metrics]
        artifacts = {a.name: a for a in session.execute(select(Artifact).where(Artifact.job_id == job_id)).scalars()}
    assert set(artifacts) == {"checkpoint-2", "checkpoint-4", "adapter", "evaluation.json"}  # evaluation.py
    adapter = studio.data_dir / artifacts["adapter"].path
    assert (adapter / "adapter_model.safetensors").is_file() and artifacts["adapter"].size_bytes > 0
    assert (studio.data_dir / artifacts["checkpoint-2"].path / "optimizer.pt").is_file()

    # Resume: a job continuing this one from checkpoint-2 reproduces steps 3 and 4 exactly (weights,
    # optimizer, scheduler, RNG and data position all restored).
    resumed = studio.job(studio.job_dataset_id(job_id), {"hyperparameters": {"eval_steps": 4}}, parent_job_id=job_id,
                         resume_from="checkpoint-2")
    done = run_train_process(studio, resumed)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    again = [data for _, kind, data in read_after(studio.redis, job_stream(resumed), count=10_000)
             if kind == "metric" and "loss" in data]
    assert [m["step"] for m in again] == [3, 4]
    assert [m["loss"] for m in again] == [m["loss"] for m in metrics[2:]]
    assert [m["grad_norm"] for m in again] == [m["grad_norm"] for m in metrics[2:]]
    assert [m["learning_rate"] for m in again] == [m["learning_rate"] for m in metrics[2:]]


def test_empty_dataset_fails_clearly(studio):
    job_id = studio.job(studio.dataset("empty.jsonl", []))
    done = run_train_process(studio, job_id)
    assert done.returncode == 1
    assert studio.get_job(job_id).error == "Dataset: empty.jsonl is empty: it has no rows."


def test_rows_whose_answers_do_not_fit_max_seq_len_fail_in_words(studio):
    # With SmolLM2's chat template (its system prompt included) 16 tokens hold no answer: TRL drops every row.
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(4)), {"hyperparameters": {"max_seq_len": 16}})
    done = run_train_process(studio, job_id)
    assert done.returncode == 1
    assert studio.get_job(job_id).error.startswith("No training row has any of its answer within max_seq_len (16 tokens)")


def test_an_exception_in_training_fails_the_job_with_its_reason(studio):
    # A chat template that raises on every row (a number format for text), once the trainer applies it.
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(4)), {"chat_template": "{{ '{:d}'.format(messages[0]['content']) }}"})
    done = run_train_process(studio, job_id)
    assert done.returncode == 1
    error = studio.get_job(job_id).error
    assert error.startswith("Training failed: ValueError: ") and "r" in error


def test_a_sweep_requeues_or_fails_running_jobs_whose_worker_has_no_heartbeat(studio):
    from lanner.core.models import JobStatus
    from lanner.core.settings import Settings
    from lanner.core.worker_registry import announce_worker
    from lanner.worker.devices import cpu_device
    from lanner.worker.runner import sweep_orphans

    dataset = studio.dataset("qa.jsonl", qa_rows(2))
    alive = studio.job(dataset, status=JobStatus.running, worker="cpu0@alive")
    sweeping = studio.job(dataset, status=JobStatus.running, worker="cpu1@sweeping")  # its heartbeat is not back yet
    opted_out = studio.job(dataset, {"requeue_on_worker_loss": False}, status=JobStatus.running, worker="gpu3@gone")
    fresh = studio.job(dataset, status=JobStatus.running, worker="gpu3@gone", step=3)
    announce_worker(studio.redis, "cpu0@alive", cpu_device("cpu0@alive"))
    settings = Settings(data_dir=studio.data_dir, database_url=studio.database_url, redis_url=studio.redis_url)
    assert sweep_orphans(settings, alive="cpu1@sweeping") == [opted_out, fresh]
    assert studio.get_job(alive).status == studio.get_job(sweeping).status == JobStatus.running
    job = studio.get_job(opted_out)
    assert job.status == JobStatus.failed and "gpu3@gone stopped while running this job" in job.error
    assert read_after(studio.redis, job_stream(opted_out))[-1][1:] == ("status", {"status": "failed", "error": job.error})
    # Lost before its first checkpoint: queued again to start over.
    job = studio.get_job(fresh)
    assert (job.status, job.resume_from, job.requeues, job.worker) == (JobStatus.queued, None, 1, None)
    events = [event[1:] for event in read_after(studio.redis, job_stream(fresh))]
    assert events[0] == ("status", {"status": "queued", "error": None, "resume_from": None, "requeues": 1})
    assert events[1][1]["message"] == ("Its worker was lost at step 3; queued again (1 of 3 requeues) to start over: "
                                       "no checkpoint yet")


def test_dpo_trains_on_preference_pairs(studio):
    pairs = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}.", "rejected": f"{2 * i + 1}."} for i in range(6)]
    job_id = studio.job(studio.dataset("pairs.jsonl", pairs), {"hyperparameters": {"max_steps": 2, "max_seq_len": 48}},
                        method="dpo")
    done = run_train_process(studio, job_id)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = [data for _, kind, data in read_after(studio.redis, job_stream(job_id), count=10_000)
               if kind == "metric" and "loss" in data]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["loss"] > 0 and "rewards/margins" in m and m["samples_per_second"] > 0 for m in metrics)
    assert (studio.data_dir / "artifacts" / str(job_id) / "adapter" / "adapter_model.safetensors").is_file()


def test_a_dataset_of_the_wrong_kind_for_the_method_fails_clearly(studio):
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(4)), method="dpo")
    assert run_train_process(studio, job_id).returncode == 1
    assert studio.get_job(job_id).error == "Dataset: its rows are alpaca (sft); this method needs preference rows."
