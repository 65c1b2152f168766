"""The training process: `python -m lanner.worker.train_process <job id>`, started by the worker for
one job. It loads the job, its dataset and model, trains, saves checkpoints and the final adapter,
and streams every step. Exit code 0: finished; 3: stopped at a cancel request (after saving a
checkpoint); 1: failed, with the reason written to the job's `error`. The worker writes the status.
"""
from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
from pathlib import Path

from lanner.backend.models import Artifact, Dataset, Job
from lanner.worker.job_process import EXIT_CANCELLED, JobFailed, JobProcess, artifacts_dir, main

# method -> (trainer module, dataset tasks it accepts)
METHODS = {
    "lora": ("lanner.worker.training.sft", ("sft",)),
    "pretrain": ("lanner.worker.training.sft", ("text",)),
    "dpo": ("lanner.worker.training.dpo", ("preference",)),
}

log = logging.getLogger("lanner.train")


def _dir_size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


class TrainProcess(JobProcess):
    failure_prefix = "Training failed"

    def __init__(self, job_id: int):
        super().__init__(job_id)
        self.cancel = None  # the CancelCallback, once training runs

    # A SIGTERM (cancel) before training starts ends the process at once; during training it asks
    # the trainer to save a checkpoint and stop at the end of the step.
    def on_sigterm(self, _signum, _frame):
        if self.cancel is None:
            os._exit(EXIT_CANCELLED)
        self.cancel.requested = True

    def add_artifact(self, kind: str, name: str, path: Path) -> None:
        with self.sessions() as session:
            session.add(Artifact(job_id=self.job_id, kind=kind, name=name,
                                 path=str(path.relative_to(self.settings.data_dir)), size_bytes=_dir_size(path)))
            session.commit()

    def on_checkpoint(self, path: Path, step: int) -> None:
        self.add_artifact("checkpoint", path.name, path)
        self.events.event("checkpoint", {"step": step, "name": path.name})
        self.events.log(f"Checkpoint saved: {path.name}")

    def load(self) -> tuple[Job, Path]:
        with self.sessions() as session:
            job = session.get(Job, self.job_id)
            if job is None:
                raise JobFailed(f"Job {self.job_id} does not exist.")
            if job.dataset_id is None:
                raise JobFailed("The job has no dataset.")
            dataset = session.get(Dataset, job.dataset_id)
            if dataset is None:
                raise JobFailed("The job's dataset was deleted.")
            path = Path(dataset.path)
            return job, path if path.is_absolute() else self.settings.data_dir / path

    def rows(self, path: Path, task: str) -> list[dict]:
        from lanner.backend.dataset_formats import DatasetError, examine, task_of

        try:
            report, rows = examine(path)
        except DatasetError as error:
            if error.report:
                self.events.event("dataset", error.report)
            raise JobFailed(f"Dataset: {error}") from None
        fmt, bad = report["format"], report["bad_rows"]
        self.events.event("dataset", report)
        self.events.log(f"Dataset {path.name}: {fmt}, {len(rows)} usable of {report['rows']} rows"
                        + (f"; {report['bad_row_count']} skipped (first: line {bad[0]['line']}: {bad[0]['reason']})"
                           if bad else ""), level="warning" if bad else "info")
        if task_of(fmt) not in task:
            raise JobFailed(f"Dataset: its rows are {fmt} ({task_of(fmt)}); this method needs "
                            f"{' or '.join(task)} rows.")
        return rows

    def run(self) -> int:
        from lanner.worker.training.options import TrainingOptions

        job, dataset_path = self.load()
        options = TrainingOptions.from_config(job.config)
        if job.method not in METHODS:
            raise JobFailed(f"The method {job.method!r} is not supported by this worker yet "
                            f"({', '.join(METHODS)}).")
        trainer_module, tasks = METHODS[job.method]
        # The dataset is checked before torch is imported (seconds to tens of seconds), so a bad one fails fast.
        rows = self.rows(dataset_path, tasks)

        import torch

        from lanner.worker.training.callbacks import CancelCallback, MetricsCallback
        from lanner.worker.training.model import load_lora_model, load_tokenizer, resolve_model
        build_trainer = importlib.import_module(trainer_module).build_trainer

        torch.manual_seed(options.seed)
        model_path = resolve_model(job.model, self.settings)
        tokenizer = load_tokenizer(model_path, options)
        model = load_lora_model(model_path, options, self.events)

        out = artifacts_dir(self.settings.data_dir, self.job_id)
        checkpoints = out / "checkpoints"
        resume = self.resume_path(job)
        self.cancel = CancelCallback()
        samples_per_step = options.per_device_train_batch_size * options.gradient_accumulation_steps
        metrics = MetricsCallback(self.events, samples_per_step, on_checkpoint=self.on_checkpoint)
        trainer = build_trainer(model, tokenizer, rows, options, str(checkpoints), [metrics, self.cancel])
        if resume:
            self.events.log(f"Resuming from {resume.name}")
        try:
            trainer.train(resume_from_checkpoint=str(resume) if resume else None)
        except torch.OutOfMemoryError as error:
            raise JobFailed(_oom_message(error, options)) from None
        except MemoryError:
            raise JobFailed(_oom_message(None, options)) from None
        if self.cancel.stopped:
            self.events.log("Stopped at the cancel request; the last checkpoint is kept")
            return EXIT_CANCELLED
        if trainer.eval_dataset is not None and trainer.state.global_step % (options.eval_steps or options.save_steps):
            trainer.evaluate()
        adapter = out / "adapter"
        shutil.rmtree(adapter, ignore_errors=True)
        trainer.save_model(str(adapter))
        tokenizer.save_pretrained(str(adapter))
        self.add_artifact("adapter", "adapter", adapter)
        self.events.log(f"Adapter saved ({_dir_size(adapter) / 1e6:.1f} MB)")
        return 0

    def resume_path(self, job: Job) -> Path | None:
        """resume_from names a checkpoint of this job or, for a job that continues another, of
        the parent job."""
        if not job.resume_from:
            return None
        for owner in (job.id, job.parent_job_id):
            if owner is not None:
                path = artifacts_dir(self.settings.data_dir, owner) / "checkpoints" / job.resume_from
                if path.is_dir():
                    return path
        raise JobFailed(f"The checkpoint {job.resume_from!r} to resume from does not exist.")


def _oom_message(error, options) -> str:
    import torch

    detail = ""
    if torch.cuda.is_available():
        peak, total = torch.cuda.max_memory_allocated(), torch.cuda.get_device_properties(0).total_memory
        detail = f" (peak {peak / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)"
    return (f"Out of memory{detail} at micro-batch {options.per_device_train_batch_size} and sequence length "
            f"{options.max_seq_length}. Try a smaller micro-batch with more gradient accumulation, a shorter "
            f"max_seq_length, gradient checkpointing, or QLoRA.")


if __name__ == "__main__":
    sys.exit(main(TrainProcess, sys.argv))
