"""A worker whose job was taken from it (another host's sweep requeued it and a worker there claimed it)
stops the job by itself; a draining worker checkpoints its job and requeues it. (A job of a vanished
host finished by another from its checkpoint: tests/storage/test_store_two_hosts.py.)"""
from __future__ import annotations

import os
import signal

from lanner.core.messages.device import Device
from lanner.core.models import Job, JobStatus
from lanner.core.streams import job_stream, read_after
from lanner.core.worker_registry import WORKER_KEY_PREFIX, announce_worker, retire_worker

from test_worker_e2e import _has_checkpoint, wake
from worker_helpers import pid_gone, qa_rows, training_pid

LONG = {"hyperparameters": {"max_steps": 8, "save_steps": 1, "before_after_eval": False}}


def logs(studio, job_id: int) -> list[str]:
    return [data["message"] for _, kind, data in read_after(studio.redis, job_stream(job_id), count=10_000)
            if kind == "log"]


def test_a_worker_stops_a_job_taken_from_it_and_a_draining_worker_requeues_its_job(studio, celery_worker):
    worker = celery_worker("cpu0", "host-a")
    dataset = studio.dataset("qa.jsonl", qa_rows(16))
    taken = studio.job(dataset, {"hyperparameters": {"max_steps": 400, "save_steps": 100}}, name="taken")
    wake(studio)
    studio.wait_for(taken, lambda j: j.status == JobStatus.running and j.step >= 1, 180, "its first step")
    pid = training_pid(studio, taken)
    # another host's sweep requeued it and a worker there claimed it; that worker is alive (its record in Redis,
    # kept past the check: host A's own sweep would otherwise requeue a job of a worker without a heartbeat)
    announce_worker(studio.redis, "cpu0@host-b", Device(kind="cpu", name="cpu", memory_total_bytes=2**34,
                                                        host="host-b"), "b-instance")
    studio.redis.expire(WORKER_KEY_PREFIX + "cpu0@host-b", 120)
    with studio.sessions() as session:
        job = session.get(Job, taken)
        job.worker, job.host, job.worker_instance = "cpu0@host-b", "host-b", "b-instance"
        session.commit()
    assert pid_gone(pid, 15), "the training process of a job taken from its worker went on"
    job = studio.get_job(taken)
    assert (job.status, job.worker, job.error) == (JobStatus.running, "cpu0@host-b", None)  # A wrote nothing
    retire_worker(studio.redis, "cpu0@host-b")
    with studio.sessions() as session:
        session.get(Job, taken).status = JobStatus.cancelled  # out of the way of the drain below
        session.commit()

    drained = studio.job(dataset, LONG, name="drained")
    wake(studio)
    studio.wait_for(drained, lambda j: j.status == JobStatus.running and j.step >= 1, 180, "its first step")
    os.killpg(worker.process.pid, signal.SIGTERM)  # what `lanner worker` does on SIGTERM
    assert worker.process.wait(120) == 0, worker.log.read_text()[-3000:]
    job = studio.get_job(drained)
    assert (job.status, job.worker, job.requeues, job.error) == (JobStatus.queued, None, 0, None)
    assert job.resume_from and job.resume_from.startswith("checkpoint-") and _has_checkpoint(studio, drained)
    assert any(message.startswith("Queued again to resume from checkpoint-") for message in logs(studio, drained))


def test_the_placement_line_names_the_host_and_the_gpus():
    from lanner.core.messages.device import Device, Placement
    from lanner.worker.runner import placement_line

    gpu = Device(kind="cuda", name="NVIDIA H200", memory_total_bytes=2**37, index=1, id="GPU-b", host="box2")
    assert placement_line(gpu) == "Placed on host box2, GPU 1"
    pair = Placement.of([gpu.model_copy(update={"index": 0, "id": "GPU-a"}), gpu], "ddp")
    assert placement_line(pair) == "Placed on host box2, GPUs 0, 1 (DDP)"
