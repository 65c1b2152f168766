"""The training record: the events a job publishes on its Redis stream (lanner.core.streams), one
model per event type, named by JobEventType. A stream entry is {"type": <type>, "data": <the event
as JSON>}, holding only the fields the publisher set, as stored streams and the web UI read them.
The worker publishes them (lanner.worker.events), the API relays them (/ws/jobs/{id}) and serves the
part the database keeps (per-step metrics, device samples: /api/jobs/{id}/metrics, /device-samples)."""
from __future__ import annotations

import enum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from lanner.core.export_spec import FormatOutcome
from lanner.core.messages.device import Device, DeviceKind, Placement
from lanner.core.models import JobStatus


class JobEventType(enum.StrEnum):
    metric = "metric"                      # one optimizer step's (or one evaluation's) values
    device = "device"                      # a telemetry sample of a device the job runs on
    log = "log"
    status = "status"
    cancel_requested = "cancel_requested"  # by the API, before the worker stops the job
    dataset = "dataset"                    # the dataset's report: format, usable rows, bad rows
    checkpoint = "checkpoint"
    evaluation = "evaluation"              # the before/after evaluation's result
    progress = "progress"                  # an export's stage and fraction done
    verification = "verification"          # an export's checks of what it wrote
    completions = "completions"            # GRPO: sampled completions of a logged step, with their rewards


class RecordEvent(BaseModel):
    TYPE: ClassVar[JobEventType]

    def data(self) -> dict[str, Any]:
        """The stream entry's data: the fields the publisher set (a device in it whole)."""
        return {key: value for key, value in self.model_dump(mode="json").items() if key in self.model_fields_set}


class StepValues(BaseModel):
    """One step's values, as the trainer logs them: these and whatever else it reports (eval_*,
    rewards/*, ...). The database keeps them per step (JobMetric.values)."""
    model_config = ConfigDict(extra="allow")

    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    epoch: float | None = None
    step_time: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    total_steps: int | None = None
    eval_loss: float | None = None
    # A mixture of experts' routers (lanner.worker.training.router_balance): the Switch load-balancing
    # loss (1 when balanced) and the busiest expert's share of the routed tokens over the mean share.
    router_aux_loss: float | None = None
    router_max_load: float | None = None


class StepMetrics(StepValues, RecordEvent):
    TYPE = JobEventType.metric
    step: int


class DeviceReading(RecordEvent):
    """A sample of a device: NVML's for a GPU; psutil's for the CPU, with the job's own processes'
    CPU and resident memory. The database keeps the job's (DeviceSample.values)."""
    TYPE = JobEventType.device

    kind: DeviceKind
    memory_used_bytes: int
    memory_total_bytes: int
    gpu_utilization_percent: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    cpu_percent: float | None = None
    process_cpu_percent: float | None = None
    process_rss_bytes: int | None = None
    # The highest resident memory each of the job's processes has had so far, summed (Linux's VmHWM):
    # the peak that samples 2 s apart miss.
    process_peak_rss_bytes: int | None = None
    device_id: str | None = None  # which of a job's devices
    rank: int | None = None       # in a job on several devices


class LogLine(RecordEvent):
    TYPE = JobEventType.log

    level: Literal["debug", "info", "warning", "error"]
    message: str
    time: str


class StatusChange(RecordEvent):
    TYPE = JobEventType.status

    status: JobStatus
    error: str | None = None
    worker: str | None = None
    device: Placement | Device | None = None
    resume_from: str | None = None  # queued again to resume from this checkpoint
    requeues: int | None = None     # the times it was queued again after its worker was lost
    by: int | None = None           # the user who cancelled it


class CancelRequested(RecordEvent):
    TYPE = JobEventType.cancel_requested

    by: int


class CheckpointSaved(RecordEvent):
    TYPE = JobEventType.checkpoint

    step: int
    name: str


class DatasetChecked(RecordEvent):
    TYPE = JobEventType.dataset
    model_config = ConfigDict(extra="allow")  # lanner.core.dataset_formats' report


class EvaluationResult(RecordEvent):
    TYPE = JobEventType.evaluation
    model_config = ConfigDict(extra="allow")

    status: str
    error: str | None = None


class ExportProgress(RecordEvent):
    TYPE = JobEventType.progress

    stage: str
    fraction: float


class ExportVerification(RecordEvent):
    """An export's end: each format asked for, kept or left out with the figures its check judged
    (published when the export ends with files, and when every format failed its check), and the
    checks themselves as `merged` and `gguf` (the manifest's `verification`)."""
    TYPE = JobEventType.verification
    model_config = ConfigDict(extra="allow")  # per artifact kind: the export manifest's checks

    formats: dict[str, FormatOutcome] = {}


class CompletionSample(BaseModel):
    prompt: str                            # the prompt's last message, its end kept
    completion: str
    rewards: dict[str, float | None]       # per reward function (None: it gave none), before weighting
    advantage: float | None = None         # the weighted reward against its group's, as GRPO trains on it


class CompletionSamples(RecordEvent):
    """GRPO: a few of a logged step's completions with their rewards (the spec's samples_logged)."""
    TYPE = JobEventType.completions

    step: int
    samples: list[CompletionSample]


# Every event type's model, one each.
RECORD_EVENTS: tuple[type[RecordEvent], ...] = (
    StepMetrics, DeviceReading, LogLine, StatusChange, CancelRequested, CheckpointSaved, DatasetChecked,
    EvaluationResult, ExportProgress, ExportVerification, CompletionSamples)
