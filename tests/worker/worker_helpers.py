"""Helpers for the worker's tests: a studio (data dir with the built-in model, migrated database,
Redis database of their own: support.WORKER_REDIS_URL), jobs made directly in the database, and a real Celery worker."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from redis import Redis

from job_specs import BUILTIN, stored_spec
from support import WORKER_REDIS_URL, process_env

REPO = Path(__file__).resolve().parents[2]

# Small enough for two shared CPU cores: a few steps of SmolLM2-135M at sequence length 64, a linear
# schedule without warmup and a tenth of the rows for validation (from 20 rows on).
TINY = {"hyperparameters": {"max_steps": 4, "batch_size": 2, "gradient_accumulation": 1, "max_seq_len": 64,
                            "learning_rate": 1e-3, "save_steps": 2, "gradient_checkpointing": False,
                            "precision": "fp32", "lr_scheduler": "linear", "warmup_ratio": 0.0,
                            "eval_fraction": 0.1},
        "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}


def training_options_of(method: str, spec: dict | None = None):
    """The training options of a stored spec of `method` with `spec`'s nested fields, as the training
    process builds them (the spec's defaults, not TINY's)."""
    from lanner.core.spec import load_spec
    from lanner.worker.training.options import training_options

    return training_options(load_spec(stored_spec(method, overrides=spec)))


def queue_events(studio, job_ids, timeout: float = 30) -> list[tuple[str, dict]]:
    """The queue stream's (kind, data) once each of job_ids has its "finished" event there: the runner publishes it
    after writing the job's final row, so a test that has just seen the row may read the stream a moment early."""
    from lanner.core.streams import QUEUE_STREAM, read_after

    deadline = time.monotonic() + timeout
    while True:
        events = [(kind, data) for _, kind, data in read_after(studio.redis, QUEUE_STREAM)]
        if {data["job_id"] for kind, data in events if kind == "finished"} >= set(job_ids) \
                or time.monotonic() > deadline:
            return events
        time.sleep(0.2)


def qa_rows(count: int) -> list[dict]:
    return [{"instruction": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."} for i in range(count)]


@dataclass
class Studio:
    """What a worker sees: settings through the environment, a database and a Redis."""
    data_dir: Path
    database_url: str
    redis: Redis
    owner_id: int
    redis_url: str = WORKER_REDIS_URL

    @property
    def env(self) -> dict:
        env = process_env()
        env.update(LANNER_DATA_DIR=str(self.data_dir), LANNER_DATABASE_URL=self.database_url,
                   LANNER_REDIS_URL=self.redis_url, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1",
                   # One thread: the two cores are shared, and competing OpenMP threads cost 3x here.
                   OMP_NUM_THREADS="1")
        return env

    def sessions(self):
        from lanner.core.db import session_factory

        return session_factory(self.database_url)()

    def dataset(self, name: str, lines: list) -> int:
        from lanner.core.models import Dataset

        path = self.data_dir / "datasets" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
        with self.sessions() as session:
            dataset = Dataset(owner_id=self.owner_id, name=name, filename=name, path=f"datasets/{name}",
                              size_bytes=path.stat().st_size)
            session.add(dataset)
            session.commit()
            return dataset.id

    def job(self, dataset_id: int, spec: dict | None = None, **fields) -> int:
        """A queued training job of TINY with `spec`'s nested fields merged in (of the built-in model unless
        `model` says)."""
        from lanner.core.models import Job

        method, gpus, model = fields.pop("method", "lora"), fields.pop("gpus", 0), fields.pop("model", BUILTIN)
        with self.sessions() as session:
            job = Job(owner_id=self.owner_id, name=fields.pop("name", "test job"), method=method,
                      model=model, dataset_id=dataset_id, gpus=gpus,
                      config=stored_spec(method, TINY, spec, model=model, dataset_id=dataset_id, gpus=gpus), **fields)
            session.add(job)
            session.commit()
            return job.id

    def job_dataset_id(self, job_id: int) -> int:
        return self.get_job(job_id).dataset_id

    def get_job(self, job_id: int):
        from lanner.core.models import Job

        with self.sessions() as session:
            return session.get(Job, job_id)

    def wait_for(self, job_id: int, condition, timeout: float, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.get_job(job_id)
            if condition(job):
                return job
            time.sleep(0.3)
        job = self.get_job(job_id)
        tails = "".join(f"\n--- {path.name}:\n{path.read_text()[-2500:]}"
                        for path in sorted((self.data_dir / "logs").glob("*.log")))
        raise AssertionError(f"job {job_id} never reached {what}: status={job.status} step={job.step} "
                             f"error={job.error}{tails}")


class CeleryWorker:
    """A real Celery worker process, started the way `lanner up` starts one."""

    def __init__(self, studio: Studio, name: str = "cpu0", host: str | None = None):
        import socket

        from lanner.cli.stack import worker_command

        self.studio = studio
        self.name = name
        self.host = host or socket.gethostname()  # LANNER_HOST_NAME: several "hosts" on this machine
        self.log = studio.data_dir / "logs" / f"worker-{name}-{self.host}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(worker_command(name, self.host), cwd=REPO,
                                            env={**studio.env, "LANNER_HOST_NAME": self.host}, stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def hostname(self) -> str:
        return f"{self.name}@{self.host}"

    def wait_ready(self, timeout: float = 60) -> "CeleryWorker":
        from lanner.core.worker_registry import live_workers

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(record.name == self.hostname for record in live_workers(self.studio.redis)):
                return self
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            time.sleep(0.3)
        raise AssertionError(f"worker did not come up:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()




def training_pid(studio: Studio, job_id: int) -> int:
    from lanner.core.streams import job_stream, read_after

    events = read_after(studio.redis, job_stream(job_id), count=10_000)
    for _, kind, data in events:
        if kind == "log" and data["message"].startswith("Training process started (pid "):
            return int(data["message"].split("(pid ")[1].split(")")[0])
    raise AssertionError(f"no training process started: {events}")


def pid_gone(pid: int, timeout: float) -> bool:
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False
