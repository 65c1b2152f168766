"""Fixtures for the playground tests: one studio (data dir, migrated SQLite, a user with an API token)
in which a real LoRA SFT of SmolLM2 ran (with its before/after evaluation) and our export pipeline
made a q8_0 GGUF of it; and the real app served by uvicorn on a port, per test, on that studio."""
from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from job_specs import BUILTIN, stored_spec
from playground_helpers import PLAYGROUND_REDIS_URL, qa_rows
from support import free_port

# Small enough for two shared CPU cores: a few steps of SmolLM2-135M at sequence length 64, a linear
# schedule without warmup, 15% of the rows held out for validation.
TINY = {"hyperparameters": {"max_steps": 4, "batch_size": 2, "gradient_accumulation": 1, "max_seq_len": 64,
                            "learning_rate": 2e-3, "save_steps": 100, "gradient_checkpointing": False,
                            "precision": "fp32", "lr_scheduler": "linear", "warmup_ratio": 0.0,
                            "eval_fraction": 0.15},
        "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}


@dataclass
class Studio:
    data_dir: Path
    database_url: str
    token: str
    owner_id: int
    trained_job: int        # a LoRA SFT with its before/after evaluation and an exported q8_0 GGUF
    no_eval_job: int        # the same with before_after_eval off, never exported
    held_out_job: int       # one step without a validation split: its evaluation holds rows out of training
    export_job: int
    rows: list[dict]

    def env(self) -> dict[str, str]:
        return {"LANNER_DATA_DIR": str(self.data_dir), "LANNER_DATABASE_URL": self.database_url,
                "LANNER_REDIS_URL": PLAYGROUND_REDIS_URL}

    def sessions(self):
        from lanner.core.db import session_factory

        return session_factory(self.database_url)()

    def add_job(self, **fields) -> int:
        from lanner.core.models import Job

        with self.sessions() as session:
            job = Job(owner_id=self.owner_id, name=fields.pop("name", "playground test"),
                      method=fields.pop("method", "lora"), model=BUILTIN,
                      config=fields.pop("config", None) or stored_spec("lora", TINY), gpus=0, **fields)
            session.add(job)
            session.commit()
            return job.id

    def set_status(self, job_id: int, status) -> None:
        from lanner.core.models import Job

        with self.sessions() as session:
            session.get(Job, job_id).status = status
            session.commit()


def _run_in_process(process_class, job_id: int) -> None:
    code = process_class(job_id).run()
    assert code == 0, f"{process_class.__name__} of job {job_id} ended with {code}"


@pytest.fixture(scope="session")
def studio(smollm2_dir, tmp_path_factory) -> Studio:
    """Trains and exports once for the whole session, in this process (one torch import, not three)."""
    import torch
    from redis import Redis

    from lanner.core import db
    from lanner.core.models import ApiToken, Dataset, Job, JobKind, JobStatus, User
    from lanner.backend.security import sha256_hex
    from lanner.core.settings import get_settings

    data_dir = tmp_path_factory.mktemp("playground") / "data"
    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / "SmolLM2-135M-Instruct").symlink_to(smollm2_dir)
    url = f"sqlite:///{data_dir / 'lanner.db'}"
    db.migrate(url)
    rows = qa_rows(24)
    dataset_file = data_dir / "datasets" / "qa.jsonl"
    dataset_file.parent.mkdir(parents=True)
    dataset_file.write_text("".join(json.dumps(row) + "\n" for row in rows))
    token = f"lnr_{uuid.uuid4().hex}"
    with db.session_factory(url)() as session:
        user = User(email="player@example.com", display_name="Player", role="member", password_hash="x")
        session.add(user)
        session.flush()
        session.add(ApiToken(user_id=user.id, name="tests", token_hash=sha256_hex(token), prefix=token[:12]))
        dataset = Dataset(owner_id=user.id, name="qa", filename="qa.jsonl", path="datasets/qa.jsonl",
                          size_bytes=dataset_file.stat().st_size)
        session.add(dataset)
        session.commit()
        owner, dataset_id = user.id, dataset.id
    studio = Studio(data_dir, url, token, owner, 0, 0, 0, 0, rows)

    def train_job(config: dict) -> int:
        return studio.add_job(dataset_id=dataset_id, config=stored_spec("lora", TINY, config, dataset_id=dataset_id),
                              status=JobStatus.running)

    Redis.from_url(PLAYGROUND_REDIS_URL).flushdb()
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in studio.env().items():
            patch.setenv(key, value)
        patch.setenv("CUDA_VISIBLE_DEVICES", "")
        patch.delenv("TRITON_INTERPRET", raising=False)  # a CPU studio trains on plain PyTorch
        get_settings.cache_clear()
        torch.set_num_threads(1)  # two shared cores: competing threads cost more than they give
        try:
            from lanner.worker.export_process import ExportProcess
            from lanner.worker.train_process import TrainProcess

            studio.trained_job = train_job({})
            _run_in_process(TrainProcess, studio.trained_job)
            # Without a validation split (no eval passes to wait for) the evaluation would use training prompts.
            studio.no_eval_job = train_job({"hyperparameters": {"max_steps": 1, "eval_fraction": 0,
                                                                "before_after_eval": False}})
            _run_in_process(TrainProcess, studio.no_eval_job)
            studio.held_out_job = train_job({"hyperparameters": {"max_steps": 1, "eval_fraction": 0}})
            _run_in_process(TrainProcess, studio.held_out_job)
            for job_id in (studio.trained_job, studio.no_eval_job, studio.held_out_job):
                studio.set_status(job_id, JobStatus.succeeded)  # what the worker writes after exit code 0
            studio.export_job = studio.add_job(
                kind=JobKind.export, method="export", parent_job_id=studio.trained_job, status=JobStatus.running,
                config={"export": {"adapter": False, "merged": False, "gguf_types": ["q8_0"], "verify": False}})
            _run_in_process(ExportProcess, studio.export_job)
            studio.set_status(studio.export_job, JobStatus.succeeded)
        finally:
            torch.set_num_threads(threads)
            get_settings.cache_clear()
    with db.session_factory(url)() as session:
        assert session.get(Job, studio.trained_job).error is None
    return studio


@dataclass
class Served:
    url: str
    app: object
    studio: Studio

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + f"/ws/playground?token={self.studio.token}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.studio.token}"}


@pytest.fixture
def served(studio, monkeypatch) -> Served:
    """The real app on a real port (uvicorn in a thread), with a fresh playground cache."""
    import uvicorn

    from lanner.backend.app import create_app
    from lanner.core.settings import get_settings

    for key, value in studio.env().items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    app = create_app()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield Served(f"http://127.0.0.1:{port}", app, studio)
    server.should_exit = True
    thread.join(10)
    cache = getattr(app.state, "playground_cache", None)
    if cache is not None:
        cache.clear()
    get_settings.cache_clear()
