"""Jobs through a real Celery worker process (started as `lanner up` starts one), real Redis, a real
database and real training of SmolLM2-135M on the CPU: completion with ordered events, clear
failures, cancel within 10 s, recovery from a worker killed with SIGKILL (and its limit), and a job
that goes on through a Redis restart."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

from redis import Redis

from lanner.cli.redis_server import start_local_redis
from lanner.core.models import Artifact, DeviceSample, JobMetric, JobStatus
from lanner.core.messages.signals import cancel_key
from lanner.core.model_catalog import estimate_job_memory
from lanner.core.queue.claim import wake_workers
from lanner.core.settings import Settings
from lanner.core.spec import MAX_REQUEUES, load_spec
from lanner.core.streams import job_stream, read_after

from support import free_port
from worker_helpers import CeleryWorker, pid_gone, qa_rows, queue_events, training_pid

FINAL = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


def wake(studio) -> None:
    assert wake_workers(Settings(data_dir=studio.data_dir, database_url=studio.database_url,
                                 redis_url=studio.redis_url))


def test_jobs_run_in_priority_order_with_ordered_events_and_clear_failures(studio, celery_worker):
    good = studio.job(studio.dataset("qa.jsonl", qa_rows(8) + ["not json"]), {"hyperparameters": {"max_steps": 2, "before_after_eval": False}},
                      name="good")
    empty = studio.job(studio.dataset("empty.jsonl", []), name="empty", priority=5)
    all_bad = studio.job(studio.dataset("bad.jsonl", [{"instruction": "x", "output": ""}, "{oops"]), name="all bad", priority=5)
    worker = celery_worker()  # queued before any worker ran: a starting worker looks at the queue itself

    for job_id in (empty, all_bad):
        studio.wait_for(job_id, lambda j: j.status in FINAL, 60, "a final status")
    job = studio.wait_for(good, lambda j: j.status in FINAL, 240, "a final status")
    assert job.status == JobStatus.succeeded, job.error
    assert job.worker == worker.hostname and job.device["kind"] == "cpu"
    assert (job.step, job.total_steps) == (2, 2) and job.finished_at is not None

    empty_job, bad_job = studio.get_job(empty), studio.get_job(all_bad)
    assert empty_job.status == bad_job.status == JobStatus.failed
    assert empty_job.error == "Dataset: empty.jsonl is empty: it has no rows."
    assert bad_job.error == ("Dataset: bad.jsonl: none of its 2 rows can be used "
                             "(line 1: 'output' is empty; "
                             "line 2: malformed JSON: Expecting property name enclosed in double quotes at column 2).")
    assert empty_job.finished_at < job.started_at and bad_job.finished_at < job.started_at  # priority first

    events = read_after(studio.redis, job_stream(good), count=10_000)
    kinds = [kind for _, kind, _ in events]
    assert events[0][1:] == ("status", {"status": "running", "error": None, "worker": worker.hostname,
                                        "device": job.device})
    assert events[-1][1:] == ("status", {"status": "succeeded", "error": None})
    assert {"dataset", "log", "metric", "checkpoint", "device"} <= set(kinds)
    sample = next(data for _, kind, data in events if kind == "device")
    assert sample["kind"] == "cpu" and 0 < sample["memory_used_bytes"] < sample["memory_total_bytes"]
    assert 0 < sample["process_rss_bytes"] <= sample["process_peak_rss_bytes"]
    # The job page's peak on the CPU is its processes' highest resident memory, which the estimate counts too.
    # (a sample taken as the job's processes end has none of them left to read)
    peak = max(data.get("process_peak_rss_bytes", 0) for _, kind, data in events if kind == "device")
    estimate = estimate_job_memory(load_spec(job.config), studio.data_dir / "models")["total_bytes"]
    assert abs(estimate - peak) <= 0.15 * peak, f"estimate {estimate / 2**20:.0f} MiB, measured peak {peak / 2**20:.0f} MiB"
    with studio.sessions() as session:
        assert session.query(DeviceSample).filter(DeviceSample.job_id == good).count() >= 1
    steps = [data["step"] for _, kind, data in events if kind == "metric" and "loss" in data]
    assert steps == [1, 2]
    ids = [event_id for event_id, _, _ in events]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    dataset = next(data for _, kind, data in events if kind == "dataset")
    assert dataset["bad_rows"] == [{"line": 9, "reason": "malformed JSON: Expecting value at column 1"}]

    failed = read_after(studio.redis, job_stream(empty), count=100)
    assert failed[-1][1:] == ("status", {"status": "failed", "error": empty_job.error})
    # The queue page hears of every start and end, with the final status, without polling.
    queue = [(kind, data["job_id"], data["status"]) for kind, data in queue_events(studio, (empty, all_bad, good))]
    assert queue == [("started", empty, "running"), ("finished", empty, "failed"),
                     ("started", all_bad, "running"), ("finished", all_bad, "failed"),
                     ("started", good, "running"), ("finished", good, "succeeded")]


def test_cancel_stops_the_job_within_10_seconds_and_keeps_its_checkpoint(studio, celery_worker):
    celery_worker()
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(16)), {"hyperparameters": {"max_steps": 500, "save_steps": 1}})
    wake(studio)
    studio.wait_for(job_id, lambda j: j.step >= 1, 180, "its first step")
    pid = training_pid(studio, job_id)

    asked = time.monotonic()
    studio.redis.set(cancel_key(job_id), "1")
    job = studio.wait_for(job_id, lambda j: j.status in FINAL, 10, "a final status within 10 s")
    assert time.monotonic() - asked <= 10
    assert job.status == JobStatus.cancelled and job.error is None
    assert pid_gone(pid, 2)
    checkpoints = sorted((studio.data_dir / "artifacts" / str(job_id) / "checkpoints").glob("checkpoint-*"))
    assert checkpoints and (checkpoints[-1] / "adapter_model.safetensors").is_file()
    assert not studio.redis.exists(cancel_key(job_id))
    events = read_after(studio.redis, job_stream(job_id), count=10_000)
    assert events[-1][2]["status"] == "cancelled"


def _has_checkpoint(studio, job_id: int) -> bool:
    with studio.sessions() as session:
        return session.query(Artifact).filter_by(job_id=job_id, kind="checkpoint").first() is not None


def _kill_mid_job(studio, worker, job_id: int) -> None:
    """SIGKILLs the worker once the job has trained two steps and has a checkpoint on record."""
    studio.wait_for(job_id, lambda j: j.step >= 2 and _has_checkpoint(studio, j.id), 180,
                    "its second step and a checkpoint")
    pid = training_pid(studio, job_id)
    os.kill(worker.process.pid, signal.SIGKILL)
    worker.process.wait()
    assert pid_gone(pid, 5), "the training process outlived its worker"
    assert studio.get_job(job_id).status == JobStatus.running


def test_a_job_resumes_from_its_checkpoint_after_its_worker_is_sigkilled(studio, celery_worker):
    worker = celery_worker()
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(16)),
                        {"hyperparameters": {"max_steps": 8, "save_steps": 1, "before_after_eval": False}})
    wake(studio)
    _kill_mid_job(studio, worker, job_id)

    celery_worker()  # restarted under the same name, as `lanner up` does
    job = studio.wait_for(job_id, lambda j: j.status in FINAL, 180, "a final status")
    assert job.status == JobStatus.succeeded, job.error
    # The newest complete checkpoint: one being written at the kill is skipped.
    assert job.resume_from.startswith("checkpoint-") and int(job.resume_from.split("-")[1]) >= 1
    assert job.requeues == 1
    events = read_after(studio.redis, job_stream(job_id), count=10_000)
    statuses = [data for _, kind, data in events if kind == "status"]
    assert [status["status"] for status in statuses] == ["running", "queued", "running", "succeeded"]
    assert statuses[1] == {"status": "queued", "error": None, "resume_from": job.resume_from, "requeues": 1}
    assert any(kind == "log" and data["message"].endswith(f"queued again (1 of {MAX_REQUEUES} requeues) to resume "
                                                          f"from {job.resume_from}") for _, kind, data in events)
    resumed_at = int(job.resume_from.split("-")[1])
    after = [data["step"] for _, kind, data in events if kind == "metric" and "loss" in data]
    assert after[-(8 - resumed_at):] == list(range(resumed_at + 1, 9))
    assert (studio.data_dir / "artifacts" / str(job_id) / "adapter" / "adapter_model.safetensors").is_file()


def test_a_job_whose_worker_is_lost_once_too_often_fails_in_words_within_60_seconds(studio, celery_worker):
    worker = celery_worker()
    job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(16)), {"hyperparameters": {"max_steps": 500, "save_steps": 1}},
                        requeues=MAX_REQUEUES)  # as if it had taken its worker down MAX_REQUEUES times before
    wake(studio)
    _kill_mid_job(studio, worker, job_id)
    killed = time.monotonic()

    celery_worker()
    job = studio.wait_for(job_id, lambda j: j.status in FINAL, 60 - (time.monotonic() - killed), "failed")
    assert time.monotonic() - killed <= 60
    assert job.status == JobStatus.failed and job.requeues == MAX_REQUEUES
    assert job.error.startswith(f"The worker {worker.hostname} stopped while running this job (killed or crashed) "
                                "and has restarted; the job did not finish. ")
    assert f"after {MAX_REQUEUES} requeues it is not queued again" in job.error
    assert "Its newest checkpoint, checkpoint-" in job.error
    statuses = [data for _, kind, data in read_after(studio.redis, job_stream(job_id), count=10_000) if kind == "status"]
    assert statuses[-1] == {"status": "failed", "error": job.error}
    assert queue_events(studio, (job_id,))[-1] == (
        "finished", {"job_id": job_id, "owner_id": job.owner_id, "name": job.name, "status": "failed",
                     "priority": job.priority, "error": job.error})


def test_a_running_job_survives_a_redis_restart(studio, tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    start = lambda: start_local_redis(url, tmp_path / "redis", tmp_path / "redis.log")  # noqa: E731
    server = start()
    studio = replace(studio, redis=Redis.from_url(url, decode_responses=True), redis_url=url)
    worker = CeleryWorker(studio)
    try:
        worker.wait_ready()
        job_id = studio.job(studio.dataset("qa.jsonl", qa_rows(16)),
                            {"hyperparameters": {"max_steps": 10, "before_after_eval": False}})
        wake(studio)
        studio.wait_for(job_id, lambda j: j.step >= 2, 180, "its second step")
        server.terminate()  # SIGTERM: Redis saves its snapshot and stops, as under `lanner up`
        server.wait(10)
        away_at = studio.get_job(job_id).step
        studio.wait_for(job_id, lambda j: j.step >= away_at + 2, 120, "two steps while Redis is away")
        server = start()  # from its snapshot, on the same port

        job = studio.wait_for(job_id, lambda j: j.status in FINAL, 180, "a final status")
        assert job.status == JobStatus.succeeded and job.error is None and job.requeues == 0
        with studio.sessions() as session:
            saved = sorted(row.step for row in session.query(JobMetric).filter_by(job_id=job_id)
                           if "loss" in row.values)
        assert saved == list(range(1, 11))
        # The events trained while Redis was away went out, in order, when it was back.
        events = read_after(studio.redis, job_stream(job_id), count=10_000)
        assert [data["step"] for _, kind, data in events if kind == "metric" and "loss" in data] == saved
        assert [data["status"] for _, kind, data in events if kind == "status"] == ["running", "succeeded"]

        # The worker is back on the broker: it takes the next wake-up.
        wake(studio)
        deadline = time.monotonic() + 60
        while studio.redis.llen("celery") and time.monotonic() < deadline:
            time.sleep(0.3)
        assert studio.redis.llen("celery") == 0, worker.log.read_text()[-3000:]
    finally:
        worker.stop()
        server.terminate()
        server.wait(10)
