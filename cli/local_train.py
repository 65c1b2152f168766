"""`lanner train CONFIG.yaml --dataset FILE --out DIR`: one job trained in the foreground on this
machine, with no API and no Redis. It runs the worker's training process itself
(lanner.worker.train_process.TrainProcess) on a data dir of its own, OUT/.lanner (a SQLite database
holding the job, its dataset and its per-step metrics); the only difference is where the events go:
to the terminal instead of the job's Redis stream. The artifacts (adapter or model, checkpoints, the
before/after evaluation) are moved into OUT at the end."""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from lanner.cli.terminal import EventPrinter, read_spec
from lanner.core.settings import Settings, get_settings
from lanner.worker.events import JobEvents
from lanner.worker.job_process import EXIT_CANCELLED, artifacts_dir, run_process
from lanner.worker.train_process import TrainProcess

RUN_DIR = ".lanner"  # inside OUT: the run's data dir


def train(config: Path, dataset: Path, out: Path) -> int:
    if not dataset.is_file():
        raise SystemExit(f"--dataset {dataset}: no such file")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"--out {out} is not empty: give a new or empty folder")
    spec = read_spec(config, dataset_id=1)  # the run's database holds this one dataset
    if spec["gpus"] > 1:
        raise SystemExit(f"gpus {spec['gpus']}: lanner train runs on one device; submit multi-GPU jobs to a "
                         "studio (lanner submit)")
    if spec["gpus"] == 0:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # as the worker starts a CPU job
    settings = _run_settings(get_settings(), out.resolve() / RUN_DIR)
    job_id = _record_job(settings, spec, dataset.resolve())
    process = LocalTrain(job_id)
    signal.signal(signal.SIGINT, process.on_sigterm)  # Ctrl-C: a checkpoint, then stop (as a cancel)
    signal.signal(signal.SIGTERM, process.on_sigterm)
    code = run_process(process)
    process.events.printer.close()
    written = artifacts_dir(settings.data_dir, job_id)
    for item in written.iterdir() if written.is_dir() else ():  # none when it failed before training
        shutil.move(str(item), str(out / item.name))
    if code == 0:
        print(f"Done: {', '.join(sorted(str(out / p.name) for p in out.iterdir() if p.name != RUN_DIR))}")
    elif code == EXIT_CANCELLED:
        print(f"Stopped; checkpoints in {out / 'checkpoints'}")
    else:
        print("Training failed (the reason is above).")
    return code


def _run_settings(user: Settings, data_dir: Path) -> Settings:
    """Settings for the run's own data dir, taken by every part of the process (get_settings); the
    models folder is the user's, so the built-in model is imported, and hub models downloaded, once; the
    store is that data dir, whatever LANNER_STORE says."""
    data_dir.mkdir(parents=True)
    user.models_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "models").symlink_to(user.models_dir.resolve(), target_is_directory=True)
    os.environ["LANNER_DATA_DIR"] = str(data_dir)
    os.environ["LANNER_DATABASE_URL"] = f"sqlite:///{data_dir / 'lanner.db'}"
    os.environ["LANNER_STORE"] = "local"  # the run's files are moved into its output folder, never uploaded
    get_settings.cache_clear()
    return get_settings()


def _record_job(settings: Settings, spec: dict, dataset: Path) -> int:
    from lanner.core import db
    from lanner.core.models import Dataset, Job, JobKind, JobStatus, Role, User
    from lanner.core.spec import STORED, JobSpec, stored_config

    settings.ensure_dirs()
    db.migrate(settings.database_url)
    checked = JobSpec.model_validate(spec, context={STORED: True})  # read_spec checked it
    with db.session_factory(settings.database_url)() as session:
        user = User(email="lanner-train@localhost", display_name="lanner train", role=Role.admin, password_hash="!")
        session.add(user)
        session.flush()
        row = Dataset(owner_id=user.id, name=dataset.stem, filename=dataset.name, path=str(dataset),
                      size_bytes=dataset.stat().st_size)
        session.add(row)
        session.flush()  # the fresh database's first dataset: the id the spec was validated with
        job = Job(owner_id=user.id, kind=JobKind.train, name=checked.name or f"{checked.method} on {dataset.name}",
                  method=checked.method, model=checked.model, dataset_id=row.id, config=stored_config(checked),
                  status=JobStatus.running, priority=checked.priority, gpus=checked.gpus,
                  resume_from=checked.resume_from, worker="lanner-train")
        session.add(job)
        session.commit()
        return job.id


class TerminalEvents(JobEvents):
    """The job's events printed instead of published; the database record is kept as the worker keeps
    it (per-step metrics, step counters), in the run's SQLite file."""

    def __init__(self, job_id: int, sessions):
        super().__init__(job_id, redis=None, sessions=sessions)
        self.printer = EventPrinter()

    def publish(self, event) -> None:
        if not self.silent:
            self.printer.show(event.TYPE.value, event.data())

    def flush(self, wait_seconds: float) -> bool:
        return True


class LocalTrain(TrainProcess):
    def job_events(self) -> JobEvents:
        return TerminalEvents(self.job_id, self.sessions)
