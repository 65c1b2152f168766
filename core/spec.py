"""The job spec: what a training run is, validated field by field before anything is queued."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

Method = Literal["lora", "qlora", "full", "pretrain", "dpo", "orpo", "kto"]
ADAPTER_METHODS = {"lora", "qlora"}
PREFERENCE_METHODS = {"dpo", "orpo", "kto"}
WHOLE_MODEL_METHODS = {"full", "pretrain"}
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")

# Learning rates that work for each method when the user gives none: adapters take large steps,
# whole-model and preference tuning small ones.
DEFAULT_LEARNING_RATE = {"lora": 2e-4, "qlora": 2e-4, "full": 2e-5, "pretrain": 1e-4,
                         "dpo": 5e-6, "orpo": 8e-6, "kto": 5e-6}
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"epochs": 1, "batch_size": 4, "gradient_accumulation": 1, "max_seq_len": 1024},
    "balanced": {"epochs": 3, "batch_size": 4, "gradient_accumulation": 4, "max_seq_len": 2048},
    "thorough": {"epochs": 5, "batch_size": 8, "gradient_accumulation": 8, "max_seq_len": 4096,
                 "warmup_ratio": 0.05},
}


class Hyperparameters(BaseModel):
    model_config = ConfigDict(extra="forbid")

    learning_rate: float | None = Field(default=None, gt=0, le=1, description="Defaults per method")
    epochs: float = Field(default=3, gt=0, le=100)
    max_steps: int | None = Field(default=None, ge=1, le=10_000_000, description="Overrides epochs when set")
    batch_size: int = Field(default=4, ge=1, le=1024)
    gradient_accumulation: int = Field(default=4, ge=1, le=1024)
    max_seq_len: int = Field(default=2048, ge=16, le=131_072)
    warmup_ratio: float = Field(default=0.03, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0, le=1)
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup"] = "cosine"
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    gradient_checkpointing: bool = True
    packing: bool = False
    seed: int = Field(default=42, ge=0, le=2**32 - 1)
    save_steps: int | None = Field(default=None, ge=1, le=10_000_000)
    eval_fraction: float = Field(default=0.0, ge=0, le=0.5)
    before_after_eval: bool = Field(default=True, description="SFT: base vs tuned answers on validation prompts")
    use_kernels: bool = Field(default=True, description="lanner.kernels on; off for a plain PyTorch + PEFT comparison run")
    oom_retry: bool = Field(default=True, description="On out of memory, retry once at half the micro-batch, same effective batch")
    memory_budget_gib: float | None = Field(
        default=None, gt=0, le=4096,
        description="lora/qlora on lanner.kernels: the GPU memory (GiB) the step may use; activations that are "
                    "dearest to recompute are kept while they fit. None: every layer is recomputed")
    offload_checkpoints: bool = Field(
        default=False, description="lora/qlora on lanner.kernels: keep the checkpointed layer inputs in host memory "
                                   "(smallest footprint). Off: only when the memory budget needs it. GPU only")


class LoraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rank: int = Field(default=16, ge=1, le=1024)
    alpha: float = Field(default=32, gt=0, le=4096)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class PreferenceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    beta: float = Field(default=0.1, gt=0, le=10)
    max_prompt_len: int | None = Field(default=None, ge=8, le=131_072)


class JobSpec(BaseModel):
    """Fields are checked in order, so the later checks can read `method` and `hyperparameters`."""
    model_config = ConfigDict(extra="forbid")

    method: Method
    model: str = Field(min_length=1, max_length=1024,
                       description="builtin/SmolLM2-135M-Instruct, a hub id (org/name) or an absolute local path")
    dataset_id: int = Field(ge=1, le=2**31 - 1)
    name: str | None = Field(default=None, max_length=200)
    preset: Literal["quick", "balanced", "thorough"] | None = Field(
        default=None, description="Fills hyperparameters the spec leaves out")
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters, validate_default=True)
    lora: LoraSettings | None = Field(default=None, validate_default=True, description="lora, qlora and preference methods; defaults for lora/qlora")
    preference: PreferenceSettings | None = Field(default=None, validate_default=True, description="dpo, orpo, kto only")
    priority: int = Field(default=0, ge=-10, le=10, description="Higher runs first; above 0 is for admins")
    gpus: int = Field(default=1, ge=0, le=8, description="0 runs on the CPU")
    resume_from: str | None = Field(default=None, max_length=255, pattern=r"^[\w.\-]+$",
                                    description="A checkpoint name of the job this one retries")

    @field_validator("model")
    @classmethod
    def _model_reference(cls, value: str) -> str:
        if value.startswith("builtin/") or HUB_ID.match(value):
            return value
        if value.startswith("/"):
            path = Path(value)
            if ".." in path.parts:
                raise ValueError("a local model path may not contain '..'")
            try:
                found = path.is_dir()
            except OSError:  # a name too long for the file system
                found = False
            if not found:
                raise ValueError(f"no model folder at {value} on this machine")
            return value
        raise ValueError("give builtin/SmolLM2-135M-Instruct, a hub id like Qwen/Qwen2.5-0.5B, or an absolute path")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("preset"), str) and data["preset"] in PRESETS:
            given = data.get("hyperparameters") or {}
            if isinstance(given, dict):
                data = {**data, "hyperparameters": {**PRESETS[data["preset"]], **given}}
        return data

    @field_validator("hyperparameters")
    @classmethod
    def _hyperparameters_fit_method(cls, value: Hyperparameters, info: ValidationInfo) -> Hyperparameters:
        method = info.data.get("method")
        if method is None:
            return value
        if value.packing and method in PREFERENCE_METHODS:
            raise ValueError(f"packing does not apply to {method}: preference pairs are never packed")
        engine_options = [name for name in ("memory_budget_gib", "offload_checkpoints") if getattr(value, name)]
        if engine_options:
            names = " and ".join(engine_options)
            if method not in ADAPTER_METHODS:
                raise ValueError(f"{names}: the memory engine runs for lora and qlora, not for {method}")
            if not value.use_kernels:
                raise ValueError(f"{names}: the memory engine is part of lanner.kernels; turn use_kernels on")
            if not value.gradient_checkpointing:
                raise ValueError(f"{names}: the memory engine plans the gradient checkpointing; "
                                 "turn gradient_checkpointing on")
        if value.learning_rate is None:
            value.learning_rate = DEFAULT_LEARNING_RATE[method]
        elif method in WHOLE_MODEL_METHODS and value.learning_rate > 1e-3:
            raise ValueError(f"learning_rate {value.learning_rate} would wreck a {method} run; use at most 1e-3")
        return value

    @field_validator("lora")
    @classmethod
    def _lora_fits_method(cls, value: LoraSettings | None, info: ValidationInfo) -> LoraSettings | None:
        method = info.data.get("method")
        if method in WHOLE_MODEL_METHODS and value is not None:
            raise ValueError(f"LoRA settings (rank, alpha, …) do not apply to {method}, which trains every weight")
        if method in ADAPTER_METHODS and value is None:
            return LoraSettings()
        return value

    @field_validator("preference")
    @classmethod
    def _preference_fits_method(cls, value: PreferenceSettings | None, info: ValidationInfo):
        method = info.data.get("method")
        if method is None:
            return value
        if method not in PREFERENCE_METHODS and value is not None:
            raise ValueError(f"preference settings (beta, …) apply to dpo, orpo and kto, not to {method}")
        if method in PREFERENCE_METHODS and value is None:
            return PreferenceSettings()
        return value

    @field_validator("gpus")
    @classmethod
    def _qlora_needs_gpu(cls, value: int, info: ValidationInfo) -> int:
        if value == 0 and info.data.get("method") == "qlora":
            raise ValueError("qlora needs a GPU (4-bit weights): set gpus to 1 or more, or use lora")
        return value


_DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def worker_options(spec: JobSpec) -> dict[str, Any]:
    """The spec in the flat names the training process reads (lanner.worker.training.options.
    TrainingOptions.from_config). A job's config holds the nested spec and these names side by side;
    spec_of() takes the spec back out."""
    hp = spec.hyperparameters
    options: dict[str, Any] = {
        "num_train_epochs": hp.epochs, "per_device_train_batch_size": hp.batch_size,
        "gradient_accumulation_steps": hp.gradient_accumulation, "learning_rate": hp.learning_rate,
        "lr_scheduler_type": hp.lr_scheduler, "weight_decay": hp.weight_decay, "max_seq_length": hp.max_seq_len,
        "packing": hp.packing, "gradient_checkpointing": hp.gradient_checkpointing, "seed": hp.seed,
        "dtype": _DTYPES[hp.precision], "validation_split": hp.eval_fraction, "warmup_ratio": hp.warmup_ratio,
        "use_kernels": hp.use_kernels, "oom_retry": hp.oom_retry,
        "memory_budget_gib": hp.memory_budget_gib, "offload_checkpoints": hp.offload_checkpoints,
    }
    if hp.max_steps is not None:
        options["max_steps"] = hp.max_steps
    if hp.save_steps is not None:
        options["save_steps"] = hp.save_steps
    if spec.lora is not None:
        options.update(lora_r=spec.lora.rank, lora_alpha=spec.lora.alpha, lora_dropout=spec.lora.dropout,
                       target_modules=None if spec.lora.target_modules == "all-linear" else spec.lora.target_modules)
    if spec.preference is not None:
        options["dpo_beta"] = spec.preference.beta
        options["max_prompt_len"] = spec.preference.max_prompt_len
    return options


def job_config(spec: JobSpec) -> dict[str, Any]:
    return {**spec.model_dump(mode="json"), **worker_options(spec)}


def spec_of(config: dict[str, Any]) -> dict[str, Any]:
    """The spec part of a stored job config (what clone and retry start from)."""
    return {key: value for key, value in config.items() if key in JobSpec.model_fields}
