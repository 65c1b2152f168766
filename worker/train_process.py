"""The training process: `python -m lanner.worker.train_process <job id>`, started by the worker for
one job. It loads the job, its dataset and model, trains, saves checkpoints and the final adapter,
and streams every step. Exit code 0: finished; 3: stopped at a cancel request (after saving a
checkpoint); 1: failed, with the reason written to the job's `error`. The worker writes the status.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path

from sqlalchemy import select

from lanner.core.messages.records import CheckpointSaved, DatasetChecked
from lanner.core.models import Artifact, ArtifactKind, Dataset, Job
from lanner.core.spec import load_spec
from lanner.core.trackers import FOLDERS, trackers_dir
from lanner.worker.distributed.ranks import is_main_process, world_size
from lanner.worker.job_process import EXIT_CANCELLED, JobFailed, JobProcess, artifacts_dir, main

# method -> (trainer module, dataset tasks it accepts). Which weights train is the model's part
# (lanner.worker.training.model): an adapter for lora, qlora and lora_fp8, every weight for full and pretrain.
METHODS = {
    "lora": ("lanner.worker.training.sft", ("sft",)),
    "qlora": ("lanner.worker.training.sft", ("sft",)),
    "lora_fp8": ("lanner.worker.training.sft", ("sft",)),
    "full": ("lanner.worker.training.sft", ("sft", "text")),
    "pretrain": ("lanner.worker.training.sft", ("text",)),
    "dpo": ("lanner.worker.training.dpo", ("preference",)),
    "orpo": ("lanner.worker.training.orpo", ("preference",)),
    "kto": ("lanner.worker.training.kto", ("kto", "preference")),
    "grpo": ("lanner.worker.training.grpo", ("prompt",)),
    "reward": ("lanner.worker.training.reward", ("preference",)),
}

log = logging.getLogger("lanner.train")
# Written beside the saved adapter or model: how it was trained, as the export reads it
# (lanner.worker.export_process): method, base model, dtype and, over a 4-bit base, its quantisation.
TRAINING_RECORD = "lanner_training.json"


def _dir_size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


class TrainProcess(JobProcess):
    failure_prefix = "Training failed"

    def __init__(self, job_id: int):
        super().__init__(job_id)
        self.cancel = None  # the CancelCallback, once training runs
        self.trackers = None  # the job's experiment trackers, once started (JobTrackers)

    # A SIGTERM (cancel) before training starts ends the process at once; during training it asks
    # the trainer to save a checkpoint and stop at the end of the step.
    def on_sigterm(self, _signum, _frame):
        if self.cancel is None:
            os._exit(EXIT_CANCELLED)
        self.cancel.requested = True

    def add_artifact(self, kind: ArtifactKind, name: str, path: Path) -> None:
        if not is_main_process():  # a multi-GPU job's artifacts are rank 0's to record
            return
        key = self.push(path)  # stored before it is on record: a recorded checkpoint can always be resumed from
        with self.sessions() as session:
            session.add(Artifact(job_id=self.job_id, kind=kind, name=name, path=key, size_bytes=_dir_size(path)))
            session.commit()

    def on_checkpoint(self, path: Path, step: int) -> None:
        self.add_artifact(ArtifactKind.checkpoint, path.name, path)
        self.events.publish(CheckpointSaved(step=step, name=path.name))
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
            return job, self.data_path(dataset.path)

    def rows(self, path: Path, task: str) -> list[dict]:
        from lanner.core.dataset_formats import DatasetError, examine, task_of

        try:
            report, rows = examine(path)
        except DatasetError as error:
            if error.report:
                self.events.publish(DatasetChecked(**error.report))
            raise JobFailed(f"Dataset: {error}") from None
        fmt, bad = report["format"], report["bad_rows"]
        self.events.publish(DatasetChecked(**report))
        self.events.log(f"Dataset {path.name}: {fmt}, {len(rows)} usable of {report['rows']} rows"
                        + (f"; {report['bad_row_count']} skipped (first: line {bad[0]['line']}: {bad[0]['reason']})"
                           if bad else ""), level="warning" if bad else "info")
        if task_of(fmt) not in task:
            raise JobFailed(f"Dataset: its rows are {fmt} ({task_of(fmt)}); this method needs "
                            f"{' or '.join(task)} rows.")
        return rows

    def run(self) -> int:
        from lanner.worker.training.options import training_options

        job, dataset_path = self.load()
        if job.method not in METHODS:
            raise JobFailed(f"The method {job.method!r} is not supported by this worker yet "
                            f"({', '.join(METHODS)}).")
        spec = load_spec(job.config)
        options = training_options(spec)
        if problem := options.problem():
            raise JobFailed(problem)
        trainer_module, tasks = METHODS[job.method]
        # The dataset is checked before torch is imported (seconds to tens of seconds), so a bad one fails fast.
        rows = self.rows(dataset_path, tasks)
        self.start_trackers(job, spec)
        try:
            code = self.train_and_save(job, options, trainer_module, rows)
        except BaseException:
            self.finish_trackers("failed")
            raise
        self.finish_trackers("finished" if code == 0 else "cancelled")
        return code

    def start_trackers(self, job: Job, spec) -> None:
        """The experiment trackers the job chose (rank 0's, in a multi-GPU job)."""
        if not spec.trackers or not is_main_process():
            return
        from lanner.worker.training.trackers import JobTrackers

        self.trackers = JobTrackers(spec.trackers, self.events, self.settings,
                                    artifacts_dir(self.settings.data_dir, self.job_id))
        self.trackers.start(self.job_id, job.name, spec.model_dump(mode="json"))

    def finish_trackers(self, outcome: str) -> None:
        """Ends the trackers' runs with links to the job's page and artifacts in the studio."""
        if self.trackers is None:
            return
        studio = self.settings.public_url
        links = {"job_url": self.settings.job_page_url(self.job_id)}
        store = self.store()
        with self.sessions() as session:
            for artifact in session.scalars(select(Artifact).where(Artifact.job_id == self.job_id)
                                            .order_by(Artifact.id)):
                folder = store.is_folder(artifact.path)
                links[f"artifact.{artifact.name}"] = (f"{studio}/api/artifacts/{artifact.id}/download"
                                                      + ("?archive=tar" if folder else ""))
        self.trackers.finish(outcome, links)
        try:
            self.record_tracker_files()
        except Exception as error:  # a tracker never fails the job
            self.events.log(f"The trackers' files could not be recorded as artifacts: {error}", level="warning")

    def record_tracker_files(self) -> None:
        """The trackers' folder (the runs' record and files) goes to the store, for the job page whichever
        host serves it, and the folders TensorBoard and W&B wrote become the job's artifacts (kinds
        tensorboard, wandb), downloaded as any folder artifact; a requeued job's row is updated, not doubled."""
        folder = trackers_dir(artifacts_dir(self.settings.data_dir, self.job_id))
        if not folder.is_dir() or not is_main_process():
            return
        self.push(folder)
        for tracker, name in FOLDERS.items():
            files = folder / name
            if not files.is_dir():
                continue
            with self.sessions() as session:
                kept = session.scalar(select(Artifact).where(Artifact.job_id == self.job_id,
                                                             Artifact.kind == ArtifactKind(tracker)))
                if kept is None:
                    session.add(Artifact(job_id=self.job_id, kind=ArtifactKind(tracker), name=name,
                                         path=files.relative_to(self.settings.data_dir).as_posix(),
                                         size_bytes=_dir_size(files)))
                else:
                    kept.size_bytes = _dir_size(files)
                session.commit()

    def train_and_save(self, job: Job, options, trainer_module: str, rows: list[dict]) -> int:
        from lanner.worker.training.callbacks import CancelCallback
        from lanner.worker.training.model import load_tokenizer, resolve_model

        model_path = resolve_model(job.model, self.settings)
        tokenizer = load_tokenizer(model_path, options)
        out = artifacts_dir(self.settings.data_dir, self.job_id)
        cancel = CancelCallback()

        def attempt(attempt_options, start: Path | None):
            return self.train(trainer_module, model_path, tokenizer, rows, attempt_options, out / "checkpoints",
                              start, cancel)

        resume = self.resume_path(job)
        trainer, out_of_memory = attempt(options, resume)
        if out_of_memory is not None:
            if cancel.requested:
                self.events.log("Stopped at the cancel request (the step had run out of memory); "
                                "the last checkpoint is kept")
                return EXIT_CANCELLED
            trainer = self.retry_smaller(out_of_memory, options, out / "checkpoints", resume, attempt)
        if cancel.stopped:
            self.events.log("Stopped at the cancel request; the last checkpoint is kept")
            return EXIT_CANCELLED
        if trainer.eval_dataset is not None and trainer.state.global_step % options.eval_steps:
            trainer.evaluate()
        self.save(trainer, tokenizer, out, job, options)
        return 0

    def train(self, trainer_module: str, model_path: str, tokenizer, rows: list[dict], options,
              checkpoints: Path, resume: Path | None, cancel):
        """One attempt: a fresh model and trainer, trained from `resume` (or the start). Returns
        (trainer, None), or (None, OutOfMemory) when it ran out of memory; by then nothing refers to the
        attempt's model, so its memory can be given back."""
        import torch

        from lanner.worker.training.callbacks import MetricsCallback
        from lanner.worker.training.memory import OutOfMemory, is_out_of_memory, memory_limit
        from lanner.worker.training.model import load_model
        from lanner.worker.training.router_balance import RouterBalance
        build_trainer = importlib.import_module(trainer_module).build_trainer

        torch.manual_seed(options.seed)
        trainer = None
        try:
            model = load_model(model_path, options, self.events)
            samples_per_step = options.per_device_train_batch_size * options.gradient_accumulation_steps * world_size()
            metrics = MetricsCallback(self.events, samples_per_step, on_checkpoint=self.on_checkpoint,
                                      trackers=self.trackers, router_balance=RouterBalance.of(model))
            trainer = build_trainer(model, tokenizer, rows, options, str(checkpoints), [metrics, cancel])
            if resume:
                self.events.log(f"Resuming from {resume.name}")
            self.cancel = cancel
            with memory_limit(options.memory_limit_mb):
                trainer.train(resume_from_checkpoint=str(resume) if resume else None)
            return trainer, None
        except Exception as error:  # the traceback holds the attempt's tensors: only a summary leaves here
            if not is_out_of_memory(error):
                raise
            self.cancel = None  # until the next attempt trains, a cancel ends the process at once
            failure = OutOfMemory.of(options, trainer)
        return None, failure

    def retry_smaller(self, failure, options, checkpoints: Path, resume: Path | None, attempt):
        """Once more, from the last checkpoint (or where the job started), at half the micro-batch and
        twice the accumulation; the job fails with the reason when that is off, impossible or not enough."""
        from lanner.worker.training.memory import newest_checkpoint_folder, release_memory, smaller_micro_batch

        smaller = smaller_micro_batch(options) if options.oom_retry else None
        if smaller is None:
            raise JobFailed(failure.message(retry="off" if not options.oom_retry else "impossible"))
        release_memory()
        start = newest_checkpoint_folder(checkpoints) or resume
        self.events.log(f"{failure.summary()}; retrying once from {start.name if start else 'the start'} with "
                        f"micro-batch {smaller.per_device_train_batch_size} x {smaller.gradient_accumulation_steps} "
                        f"accumulation steps, the same {failure.effective_batch} samples per optimizer step",
                        level="warning")
        trainer, again = attempt(smaller, start)
        if again is not None:
            raise JobFailed(again.message(retry="failed", first=failure))
        return trainer

    def save(self, trainer, tokenizer, out: Path, job: Job, options) -> None:
        """The adapter (LoRA, QLoRA), or the whole model in the training dtype (full, pretrain), with
        the training record beside it."""
        kind = ArtifactKind.adapter if options.lora else ArtifactKind.model
        path = out / kind
        if is_main_process():  # every rank of a multi-GPU job gets here; one of them writes
            shutil.rmtree(path, ignore_errors=True)
        trainer.save_model(str(path))  # on every rank: FSDP gathers the shards for rank 0 to write
        if not is_main_process():
            return
        # PEFT writes every adapter the model holds; the trained one is "default" (TRL's GRPO adds a frozen copy,
        # "ref", for its KL term, which PEFT would write into a subfolder beside it).
        for name in getattr(trainer.model, "peft_config", {}):
            if name != "default":
                shutil.rmtree(path / name, ignore_errors=True)
        tokenizer.save_pretrained(str(path))
        record = training_record(trainer.model, job, options, kind)
        (path / TRAINING_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        self.add_artifact(kind, kind, path)
        self.events.log(f"{kind.capitalize()} saved ({_dir_size(path) / 1e6:.1f} MB)")

    def resume_path(self, job: Job) -> Path | None:
        """resume_from names a checkpoint of this job or, for a job that continues another, of
        the parent job: in the store, whichever host wrote it (fetched into this host's cache)."""
        if not job.resume_from:
            return None
        store = self.store()
        for owner in (job.id, job.parent_job_id):
            if owner is not None:
                key = f"artifacts/{owner}/checkpoints/{job.resume_from}"
                if store.is_folder(key):
                    return self.data_path(key)
        raise JobFailed(f"The checkpoint {job.resume_from!r} to resume from does not exist.")


def training_record(model, job: Job, options, saved: str) -> dict:
    """The TRAINING_RECORD of a trained model. A 4-bit base's settings are read from its layers (what
    training really held): lanner.kernels' NF4, quantised from `dtype`, in blocks of `blocksize`, the
    block absmax itself quantised when `double_quant`, a mixture of experts' stacked experts too when `experts`
    (the fields of lanner.worker.export.Quantization)."""
    from lanner.kernels.quant import NF4Linear
    from lanner.kernels.quant.nf4_experts import nf4_stacked_names
    from lanner.worker.training.model import training_dtype

    record = {"method": job.method, "base_model": job.model, "saved": saved,
              "dtype": str(training_dtype(options)).removeprefix("torch.")}
    nf4 = next((module.nf4 for module in model.modules() if isinstance(module, NF4Linear)), None)
    if nf4 is not None:
        record["quantization"] = {"quant_type": "nf4", "blocksize": nf4.blocksize, "double_quant": nf4.nested,
                                  "dtype": str(nf4.dtype).removeprefix("torch."),
                                  "experts": any(nf4_stacked_names(module) for module in model.modules())}
    return record


if __name__ == "__main__":
    sys.exit(main(TrainProcess, sys.argv))
