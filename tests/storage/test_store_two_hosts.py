"""Two worker "hosts" (Celery worker processes with their own LANNER_HOST_NAME, data and cache
directories) and the API on one PostgreSQL database, one Redis and one S3 store (moto): a dataset
uploaded through the API is trained on by both; host A's store is cut for a while mid-job (the job waits,
says so, and goes on); A is SIGKILLed mid-job, B's sweep requeues the job and B finishes it from the
store's last checkpoint, with both placement lines in its log; an export on B of a job trained on A is
downloaded through the API with a byte range."""
from __future__ import annotations

import os
import re
import signal
import time
import uuid

from fastapi.testclient import TestClient
from redis import Redis

from lanner.core.models import Artifact, ArtifactKind, Job, JobKind, JobStatus
from lanner.core.settings import Settings, get_settings
from lanner.core.storage import Cache
from lanner.core.worker_registry import live_workers

from storage_helpers import ACCESS, Host, s3_settings, worker_helpers
from support import WORKER_REDIS_URL

FINAL = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


def _store_env(endpoint: str, bucket: str, cache_dir) -> dict:
    return {"LANNER_STORE": "s3", "LANNER_S3_BUCKET": bucket, "LANNER_S3_ENDPOINT_URL": endpoint,
            "LANNER_S3_PREFIX": "team", "LANNER_CACHE_DIR": str(cache_dir), "LANNER_STORE_RETRY_S": "120", **ACCESS}


def _waited_for_store(log: list[str], job_id: int) -> bool:
    # Whichever store call of the checkpoints' upload meets the cut first: a listing of the checkpoints (seen in a
    # run), a lookup or a file's upload.
    waited = re.compile(rf"The store is unreachable while (listing|looking up|uploading) "
                        rf"artifacts/{job_id}/checkpoints[/ ].*trying again in")
    return any(waited.match(line) for line in log)


def _host(tmp_path, name: str, database_url: str, owner: int, endpoint: str, bucket: str, smollm2_dir) -> Host:
    data_dir = tmp_path / name / "data"
    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / "SmolLM2-135M-Instruct").symlink_to(smollm2_dir)
    return Host(data_dir, database_url, Redis.from_url(WORKER_REDIS_URL, decode_responses=True), owner,
                store_env=_store_env(endpoint, bucket, tmp_path / name / "cache"))


def _api(tmp_path, monkeypatch, database_url: str, endpoint: str, bucket: str) -> TestClient:
    from lanner.backend import security
    from lanner.backend.app import create_app
    from lanner.core import db

    monkeypatch.setattr(security, "SCRYPT_N", 2**10)
    for key, value in {**_store_env(endpoint, bucket, tmp_path / "api" / "cache"),
                       "LANNER_DATA_DIR": str(tmp_path / "api" / "data"), "LANNER_DATABASE_URL": database_url,
                       "LANNER_REDIS_URL": WORKER_REDIS_URL, "LANNER_HUB_URL": "http://127.0.0.1:9"}.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    get_settings().ensure_dirs()
    db.migrate(database_url)
    client = TestClient(create_app())
    response = client.post("/api/setup", json={"email": "ada@example.com", "display_name": "Ada",
                                               "password": "correct horse battery"})
    assert response.status_code == 201, response.text
    return client


def _log(host: Host, job_id: int) -> list[str]:
    from lanner.core.streams import job_stream, read_after

    return [data["message"] for _, kind, data in read_after(host.redis, job_stream(job_id), count=10_000)
            if kind == "log"]


def _checkpoints(host: Host, job_id: int) -> list[Artifact]:
    with host.sessions() as session:
        return list(session.query(Artifact).filter_by(job_id=job_id, kind=ArtifactKind.checkpoint))


def test_a_job_moves_between_hosts_through_the_store(tmp_path, monkeypatch, postgres_url, moto, bucket, link,
                                                     smollm2_dir):
    Redis.from_url(WORKER_REDIS_URL).flushdb()
    client = _api(tmp_path, monkeypatch, postgres_url, moto.url, bucket)
    rows = "".join(f'{{"instruction": "What is {i} plus {i}?", "output": "{2 * i}."}}\n' for i in range(16))
    uploaded = client.post("/api/datasets", params={"filename": "qa.jsonl"}, content=rows.encode(),
                           headers={"content-type": "application/octet-stream"})
    assert uploaded.status_code == 201, uploaded.text
    dataset = uploaded.json()
    store = s3_settings(tmp_path / "probe", moto.url, bucket)
    from lanner.core.storage import get_store
    s3 = get_store(store)
    assert b"".join(s3.read(f"datasets/{dataset['id']}/qa.jsonl")).decode() == rows  # in the store...
    assert not (tmp_path / "api" / "data" / "datasets" / str(dataset["id"])).exists()  # ...not on the API's disk

    owner = client.get("/api/me").json()["id"]
    host_a = _host(tmp_path, "hostA", postgres_url, owner, link.url, bucket, smollm2_dir)  # its store link is cut below
    host_b = _host(tmp_path, "hostB", postgres_url, owner, moto.url, bucket, smollm2_dir)
    quick = host_a.job(dataset["id"], {"hyperparameters": {"max_steps": 2, "save_steps": 2, "before_after_eval": False},
                                       "trackers": ["tensorboard"]}, name="trained on A")
    moved = host_a.job(dataset["id"], {"hyperparameters": {"max_steps": 10, "save_steps": 1, "before_after_eval": False}},
                       name="moves to B")
    worker_a = worker_helpers.CeleryWorker(host_a, "cpu0", "host-a").wait_ready()
    worker_b = None
    try:
        assert host_a.wait_for(quick, lambda j: j.status in FINAL, 240, "a final status").status == JobStatus.succeeded
        [run] = client.get(f"/api/jobs/{quick}/trackers").json()  # the API reads the runs A stored
        assert run["tracker"] == "tensorboard" and run["status"] == "finished"
        [files] = [a for a in client.get(f"/api/jobs/{quick}/artifacts").json() if a["kind"] == "tensorboard"]
        archive = client.get(f"/api/artifacts/{files['id']}/download", params={"archive": "tar"})
        assert archive.content.startswith(f"job-{quick}-tensorboard/".encode())  # the files A stored
        host_a.wait_for(moved, lambda j: j.step >= 1, 120, "its first step")
        link.cut()  # host A's store is unreachable: its next checkpoint waits
        deadline = time.monotonic() + 60  # cut until A says it waits (however long a step takes on a busy machine)
        while not _waited_for_store(_log(host_a, moved), moved) and time.monotonic() < deadline:
            time.sleep(0.5)
        stalled_at = host_a.get_job(moved).step
        # Host B comes up while A waits (A trains no step meanwhile); nothing is queued for it.
        worker_b = worker_helpers.CeleryWorker(host_b, "cpu0", "host-b").wait_ready()
        assert {(record.name, record.host) for record in live_workers(host_a.redis)} == {
            ("cpu0@host-a", "host-a"), ("cpu0@host-b", "host-b")}
        job = host_a.get_job(moved)
        assert (job.worker, job.host, job.device["host"]) == ("cpu0@host-a", "host-a", "host-a")
        link.restore()
        host_a.wait_for(moved, lambda j: j.step >= 4 and len(_checkpoints(host_a, moved)) >= 3, 120,
                        "step 4 with checkpoints on record")
        pid = worker_helpers.training_pid(host_a, moved)
        os.kill(worker_a.process.pid, signal.SIGKILL)  # host A vanishes: its heartbeat goes stale, B's janitor sweeps
        worker_a.process.wait()
        assert worker_helpers.pid_gone(pid, 5), "the training process outlived its worker"
        killed_at = host_a.get_job(moved).step
        assert host_a.get_job(moved).status == JobStatus.running and killed_at < 10

        job = host_b.wait_for(moved, lambda j: j.status in FINAL, 240, "a final status on host B")
        assert job.status == JobStatus.succeeded, job.error
        assert (job.worker, job.host, job.requeues) == ("cpu0@host-b", "host-b", 1)
        log = _log(host_a, moved)
        assert _waited_for_store(log, moved), log
        assert "Placed on host host-a, the CPU" in log and "Placed on host host-b, the CPU" in log
        assert any(line.endswith(f"to resume from {job.resume_from}") for line in log)
        assert f"Resuming from {job.resume_from}" in log
        assert stalled_at <= 3  # training waited at the checkpoint while the store was away
        # Nothing lost: every checkpoint on record, the adapter and the dataset are in the store.
        for checkpoint in _checkpoints(host_a, moved):
            assert s3.is_folder(checkpoint.path) and "adapter_model.safetensors" in s3.list(checkpoint.path)
        assert "adapter_model.safetensors" in s3.list(f"artifacts/{moved}/adapter")
        resumed = Cache(get_store(store), tmp_path / "hostB" / "cache", 1)
        assert resumed.entry(f"artifacts/{moved}/checkpoints/{job.resume_from}").is_dir()  # B fetched it
        for host in ("hostA", "hostB"):  # the uploaded dataset was read on both hosts, from their caches
            assert Cache(s3, tmp_path / host / "cache", 1).entry(f"datasets/{dataset['id']}/qa.jsonl").is_dir()

        # An export on B of the job trained on A, downloaded through the API with a range.
        with host_b.sessions() as session:
            export = Job(owner_id=owner, kind=JobKind.export, name="export", method="export",
                         model=host_b.get_job(quick).model, parent_job_id=quick, status=JobStatus.queued,
                         config={"export": {"adapter": True, "merged": False, "gguf_types": [], "verify": False}})
            session.add(export)
            session.commit()
            export_id = export.id
        from lanner.core.queue.claim import wake_workers
        wake_workers(Settings(data_dir=tmp_path / "probe", redis_url=WORKER_REDIS_URL))
        done = host_b.wait_for(export_id, lambda j: j.status in FINAL, 180, "the export's final status")
        assert done.status == JobStatus.succeeded and done.worker == "cpu0@host-b", done.error
        artifacts = client.get(f"/api/jobs/{export_id}/artifacts").json()
        adapter = next(item for item in artifacts if item["kind"] == "adapter")
        name = "adapter_model.safetensors"
        with host_b.sessions() as session:
            path = session.get(Artifact, adapter["id"]).path
        key = f"{path}/{name}" if adapter.get("files") else path
        whole = b"".join(s3.read(key))
        response = client.get(f"/api/artifacts/{adapter['id']}/download",
                              params={"file": name} if adapter.get("files") else {},
                              headers={"Range": "bytes=100-1123"})
        assert response.status_code == 206, response.text
        assert response.content == whole[100:1124]
        assert response.headers["content-range"] == f"bytes 100-1123/{len(whole)}"
        assert not (tmp_path / "api" / "data" / "artifacts").exists()  # served from the API's cache
    finally:
        for worker in (worker_a, worker_b):
            if worker is not None:
                worker.stop()
        get_settings.cache_clear()
