"""The export process: `python -m lanner.worker.export_process <job id>`, started by the worker for an
export job. It reads the trained job's adapter (LoRA, QLoRA) or, for a job that trained every weight,
its model; runs lanner.worker.export (adapter, merged model, GGUF files, each verified against the
trained model), streams its progress and records every file as an artifact with its verification.
Exit codes as train_process: 0 done, 1 failed (reason in the job's `error`), 3 stopped at a cancel
request (nothing half-written is kept); and 4 done with some formats left out because they failed
their check (the job succeeds with what it kept; its `error` names each one left out and why)."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from lanner.core.export_spec import ExportSpec
from lanner.core.messages.records import ExportProgress, ExportVerification
from lanner.core.models import Artifact, ArtifactKind, Job, JobStatus
from lanner.worker.job_process import EXIT_CANCELLED, EXIT_PARTIAL, JobFailed, JobProcess, artifacts_dir, main
from lanner.worker.train_process import TRAINING_RECORD


class Cancelled(Exception):
    pass


# Within a stage, at most one progress event this often: the converters report every tensor (565 for
# SmolLM2), far more than a progress bar shows and a job's stream should keep. A stage's first and
# last reports (0 and 1) always go out.
PROGRESS_INTERVAL_S = 0.5


class ExportProcess(JobProcess):
    failure_prefix = "Export failed"

    def __init__(self, job_id: int):
        super().__init__(job_id)
        self.cancel_requested = False
        self.published_stage: str | None = None
        self.published_at = 0.0

    def on_sigterm(self, _signum, _frame):
        self.cancel_requested = True  # raised from the next progress call; the export cleans up

    def progress(self, stage: str, fraction: float) -> None:
        if self.cancel_requested:
            raise Cancelled()
        now = time.monotonic()
        if stage == self.published_stage and 0.0 < fraction < 1.0 and now - self.published_at < PROGRESS_INTERVAL_S:
            return
        self.published_stage, self.published_at = stage, now
        self.events.publish(ExportProgress(stage=stage, fraction=round(fraction, 3)))

    def load(self) -> tuple[Job, Job, Artifact, Path]:
        with self.sessions() as session:
            job, parent, trained = self.parent_weights(session, "The trained job this export reads was deleted.")
            if parent.status != JobStatus.succeeded:
                raise JobFailed(f"Job {parent.id} has not finished training ({parent.status.value}); nothing to export.")
            if trained is None:
                raise JobFailed(f"Job {parent.id} saved neither an adapter nor a model; nothing to export.")
            return job, parent, trained, self.data_path(trained.path)

    def run(self) -> int:
        job, parent, trained, trained_dir = self.load()
        spec = ExportSpec.model_validate(job.config.get("export", {}))
        from lanner.worker.export import ExportError, ExportRequest, run_export
        from lanner.worker.training.model import resolve_model

        is_adapter = trained.kind == ArtifactKind.adapter
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{parent.model.rsplit('/', 1)[-1]}-job{parent.id}").strip("-")
        request = ExportRequest(
            base_model_dir=Path(resolve_model(parent.model, self.settings)),
            adapter_dir=trained_dir if is_adapter else None, model_dir=None if is_adapter else trained_dir,
            out_dir=artifacts_dir(self.settings.data_dir, self.job_id) / "export", base_model_name=parent.model,
            name=name, adapter=spec.adapter if "adapter" in spec.model_fields_set else is_adapter,
            merged=spec.merged, merged_dtype=spec.merged_dtype, gguf_types=tuple(spec.gguf_types), verify=spec.verify,
            device="cuda" if _cuda() else "cpu",
            base_quantization=base_quantization(parent, trained_dir) if is_adapter else None)
        self.events.log(f"Exporting job {parent.id}'s {trained.kind}: adapter={request.adapter}, "
                        f"merged={request.merged}, gguf={list(request.gguf_types)}"
                        + (f", merged into its 4-bit base {request.base_quantization}"
                           if request.base_quantization is not None else ""))
        try:
            manifest = run_export(request, self.progress)
        except Cancelled:
            self.events.log("Stopped at the cancel request; nothing half-written is kept")
            return EXIT_CANCELLED
        except ExportError as error:
            if error.formats:  # every format failed its check: the figures go out as for a partial export
                self.events.publish(ExportVerification(**(error.verification or {}), formats=error.formats))
            raise JobFailed(f"Export: {error}") from None
        self.record(manifest, request.out_dir)
        self.events.publish(ExportVerification(**manifest["verification"], formats=manifest["formats"]))
        if manifest["failed"]:
            self.report_left_out(manifest["failed"])
            return EXIT_PARTIAL
        return 0

    def report_left_out(self, failed: dict[str, str]) -> None:
        """Each format left out, in the log and in the job's `error` (kept when the job succeeds)."""
        for format_name, reason in failed.items():
            self.events.log(f"Left out {format_name}: {reason}", level="warning")
        reasons = "; ".join(f"{format_name}: {reason}" for format_name, reason in failed.items())
        with self.sessions() as session:
            session.get(Job, self.job_id).error = (
                f"Exported with {len(failed)} format{'s' if len(failed) > 1 else ''} left out "
                f"({', '.join(failed)}); the other files passed their checks and are kept. {reasons}")
            session.commit()

    def record(self, manifest: dict, out_dir: Path) -> None:
        with self.sessions() as session:
            for item in manifest["artifacts"]:
                path = out_dir / item["path"]
                key = self.push(path)
                verification = None
                kind = ArtifactKind(item["kind"])  # the manifest names its files by artifact kind
                if kind == ArtifactKind.merged:
                    verification = manifest["verification"].get("merged")
                elif kind == ArtifactKind.gguf:
                    verification = manifest["verification"].get("gguf", {}).get(item.get("type"))
                session.add(Artifact(job_id=self.job_id, kind=kind, name=path.name,
                                     path=key, size_bytes=item["bytes"],
                                     verification=verification))
            session.commit()
        self.events.log(f"Export done: {len(manifest['artifacts'])} files, {manifest['bytes'] / 1e6:.1f} MB")


def base_quantization(parent: Job, adapter_dir: Path) -> dict | None:
    """A QLoRA adapter is merged into the 4-bit base its training saw, dequantised, with the settings
    (lanner.worker.export.Quantization's fields) its training recorded beside it (TRAINING_RECORD).
    An adapter saved before training recorded them: the job's config["quantization"], else Lanner's
    QLoRA defaults. None for an adapter trained on the unquantised base."""
    record_file = adapter_dir / TRAINING_RECORD
    if record_file.is_file():
        return json.loads(record_file.read_text()).get("quantization")
    if parent.method != "qlora":
        return None
    return dict((parent.config or {}).get("quantization") or {})


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main(ExportProcess, sys.argv))
