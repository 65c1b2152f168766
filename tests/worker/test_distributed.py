"""One job on two devices, through real Celery workers: two CPU workers stand in for two GPUs, and the
job runs under torch's elastic launcher (torchrun) as two gloo ranks training SmolLM2. Its loss per step
matches one process at the same global batch; only rank 0 reports; a rank that dies fails the job and
frees every device; cancel stops every rank."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from lanner.core.models import Artifact, JobMetric, JobStatus
from lanner.core.messages.signals import cancel_key
from lanner.core.streams import job_stream, read_after
from lanner.core.worker_registry import device_holders

from worker_helpers import pid_gone, qa_rows, queue_events, training_pid

FINAL = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)
FAST = {"before_after_eval": False}  # hyperparameters


@pytest.fixture
def two_workers(celery_worker):
    return [celery_worker("cpu0"), celery_worker("cpu1")]


def ranks(launcher_pid: int) -> dict[int, psutil.Process]:
    """The launcher's rank processes by rank, once both have started."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = {}
        for child in psutil.Process(launcher_pid).children():
            try:
                found[int(child.environ()["RANK"])] = child
            except (psutil.Error, KeyError):
                pass
        if len(found) == 2:
            return found
        time.sleep(0.2)
    raise AssertionError(f"the ranks of launcher {launcher_pid} did not start")


def freed(redis, job) -> bool:
    """Whether the job's devices are freed: at once, but an idle worker looking at the (empty) queue
    holds its own device for a moment. Within 5 s: sooner than a forgotten reservation expires (10 s)."""
    deadline = time.monotonic() + 5
    while device_holders(redis, [d["id"] for d in job.device["devices"]]):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def losses(studio, job_id: int) -> list[tuple[int, float]]:
    events = read_after(studio.redis, job_stream(job_id), count=10_000)
    return [(data["step"], data["loss"]) for _, kind, data in events if kind == "metric" and "loss" in data]


def test_two_ranks_train_like_one_process_at_the_same_global_batch_and_only_rank_0_reports(studio, two_workers):
    dataset = studio.dataset("qa.jsonl", qa_rows(16))
    one = studio.job(dataset, {"hyperparameters": {**FAST, "max_steps": 3, "batch_size": 4}}, name="one process", priority=1)
    two = studio.job(dataset, {"hyperparameters": {**FAST, "max_steps": 3, "batch_size": 2}}, name="two ranks", gpus=2)

    for job_id in (one, two):
        job = studio.wait_for(job_id, lambda j: j.status in FINAL, 300, "a final status")
        assert job.status == JobStatus.succeeded, job.error
    job = studio.get_job(two)
    assert job.device["strategy"] == "ddp"
    assert {device["id"] for device in job.device["devices"]} == {f"cpu:{w.hostname}" for w in two_workers}
    assert freed(studio.redis, job)

    single, double = losses(studio, one), losses(studio, two)
    assert [step for step, _ in double] == [1, 2, 3]  # each step reported once: by rank 0 only
    assert [step for step, _ in single] == [1, 2, 3]
    assert [loss for _, loss in double] == pytest.approx([loss for _, loss in single], rel=1e-3), (single, double)
    with studio.sessions() as session:
        rows = session.query(JobMetric).filter(JobMetric.job_id == two).all()
        assert sorted(row.step for row in rows if "loss" in row.values) == [1, 2, 3]
        artifacts = [(row.kind, row.name) for row in session.query(Artifact).filter(Artifact.job_id == two)]
    checkpoints = [name for kind, name in artifacts if kind == "checkpoint"]
    assert [kind for kind, _ in artifacts].count("adapter") == 1  # written once, by rank 0
    assert checkpoints and len(checkpoints) == len(set(checkpoints))
    assert (studio.data_dir / "artifacts" / str(two) / "adapter" / "adapter_model.safetensors").is_file()

    events = read_after(studio.redis, job_stream(two), count=10_000)
    logs = [data["message"] for _, kind, data in events if kind == "log"]
    assert any(message.endswith("on 2 devices (DDP)") for message in logs)
    assert sum(message.startswith("Training for ") for message in logs) == 1
    queue = [(kind, data["status"]) for kind, data in queue_events(studio, (two,)) if data["job_id"] == two]
    assert queue == [("started", "running"), ("finished", "succeeded")]


def test_a_rank_that_dies_fails_the_job_and_frees_every_device(studio, two_workers):
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(16)), {"hyperparameters": {**FAST, "max_steps": 500}}, gpus=2)
    studio.wait_for(job_id, lambda j: j.step >= 1, 240, "its first step")
    launcher = training_pid(studio, job_id)
    processes = ranks(launcher)

    os.kill(processes[1].pid, signal.SIGKILL)
    job = studio.wait_for(job_id, lambda j: j.status in FINAL, 60, "a final status")
    assert job.status == JobStatus.failed
    assert job.error.startswith("Rank 1 of 2 was killed by SIGKILL"), job.error
    assert all(pid_gone(pid, 10) for pid in (launcher, processes[0].pid, processes[1].pid))
    assert freed(studio.redis, job)
    assert read_after(studio.redis, job_stream(job_id), count=10_000)[-1][2] == {"status": "failed", "error": job.error}


def test_cancel_stops_every_rank_within_10_seconds_and_keeps_its_checkpoints(studio, two_workers):
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(16)), {"hyperparameters": {**FAST, "max_steps": 500, "save_steps": 1}}, gpus=2)
    studio.wait_for(job_id, lambda j: j.step >= 1, 240, "its first step")
    launcher = training_pid(studio, job_id)
    processes = ranks(launcher)

    asked = time.monotonic()
    studio.redis.set(cancel_key(job_id), "1")
    job = studio.wait_for(job_id, lambda j: j.status in FINAL, 10, "a final status within 10 s")
    assert time.monotonic() - asked <= 10
    assert job.status == JobStatus.cancelled and job.error is None
    assert all(pid_gone(pid, 2) for pid in (launcher, *(process.pid for process in processes.values())))
    assert freed(studio.redis, job)
    checkpoints = sorted((studio.data_dir / "artifacts" / str(job_id) / "checkpoints").glob("checkpoint-*"))
    assert checkpoints and (checkpoints[-1] / "adapter_model.safetensors").is_file()
