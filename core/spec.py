"""The job spec: everything a training run can be told, validated field by field before anything is
queued, stored in the job's config as {"version": SPEC_VERSION, "spec": {...}} (stored_config) and
read back by the worker, clone and retry (load_spec). docs/job-spec.md lists the fields."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from lanner.core.default_model import DEFAULT_MODEL_ID
from lanner.core.errors import UserError
from lanner.core.model_paths import NOT_ALLOWED, allowed_model_folder
from lanner.core.rewards.builtin import BUILTIN_KINDS, schema_shape_problem
from lanner.core.settings import get_settings

# Bumped when a stored spec would mean something else to this code: a field renamed or removed, a
# default changed; each bump comes with an Alembic data migration of the stored jobs.
SPEC_VERSION = 2
# The validation context of a spec read back from the database: checks of this machine (a local
# model folder) were made when it was queued and belong to the machine that runs it.
STORED = "stored"

Method = Literal["lora", "qlora", "lora_fp8", "full", "pretrain", "dpo", "orpo", "kto", "grpo", "reward"]
ADAPTER_METHODS = {"lora", "qlora", "lora_fp8"}
# LoRA over a base stored and multiplied in FP8 (lanner.kernels, docs/fp8.md): FP8 tensor cores.
FP8_NEEDS_GPU = ("lora_fp8 needs a GPU with FP8 tensor cores (compute capability 8.9 or newer: Ada, Hopper): "
                 "set gpus to 1 or more, or use lora")
# Reinforcement learning from reward functions: an adapter by default, as the preference methods.
RL_METHODS = {"grpo"}
PREFERENCE_METHODS = {"dpo", "orpo", "kto"}
# lanner.kernels' memory engine plans the checkpointing of these methods' adapters (GRPO's policy: the loss's
# forward and backward, and the reference log-probs when the adapter is switched off).
MEMORY_ENGINE_METHODS = ADAPTER_METHODS | RL_METHODS
WHOLE_MODEL_METHODS = {"full", "pretrain"}
# A reward model: the base with a one-number score head, trained on preference pairs (TRL's RewardTrainer);
# an adapter (and the head) when the spec gives LoRA settings, every weight otherwise, as the preference methods.
REWARD_MODEL_METHODS = {"reward"}
# NaN and Infinity pass every bound check (comparisons with NaN are all false) and cannot be stored as JSON.
SPEC_MODEL_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]{0,95}/[A-Za-z0-9][\w.\-]{0,95}$")

# Learning rates that work for each method when the user gives none: adapters take large steps,
# whole-model and preference tuning small ones.
DEFAULT_LEARNING_RATE = {"lora": 2e-4, "qlora": 2e-4, "lora_fp8": 2e-4, "full": 2e-5, "pretrain": 1e-4,
                         "dpo": 5e-6, "orpo": 8e-6, "kto": 5e-6, "grpo": 1e-5, "reward": 1e-5}
# Times a job goes back to the queue after losing its worker (requeue_on_worker_loss) before it fails:
# a job that takes its worker down every time must not loop.
MAX_REQUEUES = 3
# A validation split of fewer rows would say nothing: below it eval_fraction is not taken.
MIN_ROWS_FOR_VALIDATION = 20
# Experiment trackers a job may be logged to (lanner.worker.training.trackers).
Tracker = Literal["mlflow", "tensorboard", "wandb"]
MLFLOW_NOT_SET_UP = ("MLflow is not set up on this studio: an admin sets LANNER_MLFLOW_TRACKING_URI "
                     "(and LANNER_MLFLOW_EXPERIMENT) first")
PRESETS: dict[str, dict[str, Any]] = {
    "quick": {"epochs": 1, "batch_size": 4, "gradient_accumulation": 1, "max_seq_len": 1024},
    "balanced": {"epochs": 3, "batch_size": 4, "gradient_accumulation": 4, "max_seq_len": 2048},
    "thorough": {"epochs": 5, "batch_size": 8, "gradient_accumulation": 8, "max_seq_len": 4096,
                 "warmup_ratio": 0.05},
}


class Hyperparameters(BaseModel):
    model_config = SPEC_MODEL_CONFIG

    learning_rate: float | None = Field(default=None, gt=0, le=1, description="Defaults per method",
                                        json_schema_extra={"x-default-by-method": DEFAULT_LEARNING_RATE})
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
    save_steps: int = Field(default=50, ge=1, le=10_000_000, description="Steps between checkpoints")
    eval_fraction: float = Field(default=0.0, ge=0, le=0.5,
                                 description="Share of the rows held out for an eval loss, when the dataset has "
                                             f"{MIN_ROWS_FOR_VALIDATION} rows or more")
    eval_steps: int | None = Field(default=None, ge=1, le=10_000_000,
                                   description="Steps between evaluations on the held-out rows; default: save_steps")
    max_grad_norm: float = Field(default=1.0, ge=0, le=1000, description="Gradient clipping; 0 turns it off")
    completion_only_loss: bool = Field(default=True, description="SFT: loss on the answers only, not the prompts")
    before_after_eval: bool = Field(default=True, description="SFT: base vs tuned answers on validation prompts")
    use_kernels: bool = Field(default=True, description="lanner.kernels on; off for a plain PyTorch + PEFT comparison run")
    oom_retry: bool = Field(default=True, description="On out of memory, retry once at half the micro-batch, same effective batch")
    memory_budget_gib: float | None = Field(
        default=None, gt=0, le=4096,
        description="lora/qlora/lora_fp8 and a grpo adapter on lanner.kernels: the GPU memory (GiB) the step may use; "
                    "activations that are dearest to recompute are kept while they fit. None: every layer is recomputed")
    offload_checkpoints: bool = Field(
        default=False, description="lora/qlora/lora_fp8 and a grpo adapter on lanner.kernels: keep the checkpointed layer "
                                   "inputs in host memory (smallest footprint). Off: only when the memory budget needs it. "
                                   "GPU only")
    memory_limit_mb: int | None = Field(
        default=None, ge=1, le=2**31 - 1,
        description="A cap (MiB) on what the training steps may allocate above what is in use when they start; "
                    "an allocation over it fails as a full device does (out-of-memory retry included)")


# The form's LoRA targets choice for a mixture of experts, as target_modules. "all-linear" is the
# attention and MLP projections (lanner.kernels' DEFAULT_TARGET_MODULES); on an MoE model the MLP names
# adapt the experts' stacked weights (PEFT target_parameters), docs/job-spec.md.
LORA_TARGET_CHOICES: dict[str, list[str] | str] = {
    "attention": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "experts": ["gate_proj", "up_proj", "down_proj"],
    "all": "all-linear",
}


class LoraSettings(BaseModel):
    model_config = SPEC_MODEL_CONFIG

    rank: int = Field(default=16, ge=1, le=1024)
    alpha: float = Field(default=32, gt=0, le=4096)
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear", description="The projections LoRA adapts, by name; all-linear: attention and MLP "
                                          "(on a mixture of experts, the experts)",
        json_schema_extra={"x-target-choices": LORA_TARGET_CHOICES})


class PreferenceSettings(BaseModel):
    model_config = SPEC_MODEL_CONFIG

    beta: float = Field(default=0.1, gt=0, le=10)
    max_prompt_len: int | None = Field(default=None, ge=8, le=131_072)


# reward_model: a finished reward job's model scores each prompt and completion, in the training process.
REWARD_KINDS = (*BUILTIN_KINDS, "python", "reward_model")
# A user's reward function is source text stored in the job's spec.
REWARD_SOURCE_LIMIT = 20_000
# What each kind of reward function reads besides kind, name and weight; nothing else may be given.
REWARD_FIELDS = {"exact_match": {"column"}, "numeric_match": {"column", "tolerance"}, "regex": {"pattern"},
                 "length_penalty": {"max_chars"}, "json_schema": {"json_schema"}, "python": {"source"},
                 "reward_model": {"job_id"}}
REWARD_REQUIRED = {"regex": "pattern", "length_penalty": "max_chars", "json_schema": "json_schema", "python": "source",
                   "reward_model": "job_id"}
OPTIONAL_REWARD_FIELDS = sorted(set().union(*REWARD_FIELDS.values()))


class RewardFunction(BaseModel):
    """One of a GRPO job's reward functions (lanner.core.rewards): a built-in or Python source that
    defines reward(prompts, completions, **columns) -> one number (or None) per completion."""
    model_config = SPEC_MODEL_CONFIG

    kind: Literal[REWARD_KINDS]  # type: ignore[valid-type]
    name: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,39}$",
                             description="Its label on the charts; default: the kind")
    weight: float = Field(default=1.0, ge=-100, le=100, description="Its share of the reward")
    column: str | None = Field(default=None, min_length=1, max_length=200,
                               description="exact_match, numeric_match: the dataset's reference column (default answer)")
    tolerance: float | None = Field(default=None, ge=0, le=1e12,
                                    description="numeric_match: absolute or relative (default 1e-6)")
    pattern: str | None = Field(default=None, min_length=1, max_length=2000, description="regex: searched for")
    max_chars: int | None = Field(default=None, ge=1, le=1_000_000,
                                  description="length_penalty: 0 up to this, -1 at twice it")
    json_schema: dict[str, Any] | None = Field(default=None, description="json_schema: type, properties, required, "
                                                                         "items, enum, additionalProperties")
    source: str | None = Field(default=None, min_length=1, max_length=REWARD_SOURCE_LIMIT,
                               description="python: defines reward(prompts, completions, **columns)")
    job_id: int | None = Field(default=None, ge=1, le=2**31 - 1, strict=True,
                               description="reward_model: a succeeded reward job whose model scores the completions")

    @model_validator(mode="after")
    def _fits_kind(self) -> "RewardFunction":
        given = {name for name in OPTIONAL_REWARD_FIELDS if getattr(self, name) is not None}
        if stray := given - REWARD_FIELDS[self.kind]:
            raise ValueError(f"{', '.join(sorted(stray))} does not apply to a {self.kind} reward function")
        if (required := REWARD_REQUIRED.get(self.kind)) and getattr(self, required) is None:
            raise ValueError(f"a {self.kind} reward function needs {required}")
        if self.kind in ("exact_match", "numeric_match") and self.column is None:
            self.column = "answer"
        if self.kind == "numeric_match" and self.tolerance is None:
            self.tolerance = 1e-6
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as error:
                raise ValueError(f"pattern {self.pattern!r} is not a regular expression: {error}") from None
        if self.json_schema is not None and (problem := schema_shape_problem(self.json_schema)):
            raise ValueError(problem)
        if self.source is not None:
            try:  # parsed, never run: the code runs in the reward sandbox only
                tree = ast.parse(self.source)
            except SyntaxError as error:
                raise ValueError(f"the code does not parse: {error.msg} on line {error.lineno}") from None
            if not any(isinstance(node, ast.FunctionDef) and node.name == "reward" for node in tree.body):
                raise ValueError("the code must define a function reward(prompts, completions, **columns)")
        return self

    @property
    def label(self) -> str:
        return self.name or self.kind


def _distinct_labels(value: list[RewardFunction]) -> list[RewardFunction]:
    labels = [function.label for function in value]
    if repeated := sorted({label for label in labels if labels.count(label) > 1}):
        raise ValueError(f"two reward functions are called {repeated[0]}: give each a name of its own")
    return value


RewardFunctions = Annotated[list[RewardFunction], Field(min_length=1, max_length=8), AfterValidator(_distinct_labels)]


class GrpoSettings(BaseModel):
    model_config = SPEC_MODEL_CONFIG

    reward_functions: RewardFunctions
    num_generations: int = Field(default=4, ge=2, le=64, description="Completions per prompt (the group)")
    max_completion_len: int = Field(default=256, ge=1, le=32_768, description="Tokens per completion")
    temperature: float = Field(default=1.0, gt=0, le=2)
    beta: float = Field(default=0.04, ge=0, le=10, description="KL coefficient; 0: no reference model")
    samples_logged: int = Field(default=4, ge=0, le=64,
                                description="Sampled completions with their rewards kept per logged step")
    reward_timeout_s: float = Field(default=30, gt=0, le=600,
                                    description="Time limit of the reward functions on one batch")
    load_in_4bit: bool = Field(default=False, description="The base in 4-bit NF4 under the adapter, as qlora; GPU")


class JobSpec(BaseModel):
    """Fields are checked in order, so the later checks can read `method` and `hyperparameters`."""
    model_config = SPEC_MODEL_CONFIG

    method: Method = Field(json_schema_extra={"x-method-groups": {
        "adapter": sorted(ADAPTER_METHODS), "preference": sorted(PREFERENCE_METHODS),
        "whole_model": sorted(WHOLE_MODEL_METHODS), "rl": sorted(RL_METHODS),
        "reward_model": sorted(REWARD_MODEL_METHODS)}})
    model: str = Field(min_length=1, max_length=1024,
                       description="builtin/SmolLM2-135M-Instruct, a hub id (org/name) or an absolute local path")
    dataset_id: int = Field(ge=1, le=2**31 - 1, strict=True)
    name: str | None = Field(default=None, max_length=200)
    preset: Literal["quick", "balanced", "thorough"] | None = Field(
        default=None, description="Fills hyperparameters the spec leaves out", json_schema_extra={"x-presets": PRESETS})
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters, validate_default=True)
    lora: LoraSettings | None = Field(default=None, validate_default=True,
                                      description="lora, qlora, preference methods and reward; defaults for lora/qlora")
    preference: PreferenceSettings | None = Field(default=None, validate_default=True, description="dpo, orpo, kto only")
    grpo: GrpoSettings | None = Field(default=None, validate_default=True,
                                      description="grpo only (required): the reward functions and the sampling")
    priority: int = Field(default=0, ge=-10, le=10, description="Higher runs first; above 0 is for admins")
    gpus: int = Field(default=1, ge=0, le=8, description="0 runs on the CPU")
    resume_from: str | None = Field(default=None, max_length=255, pattern=r"^[\w.\-]+$",
                                    description="A checkpoint name of the job this one retries")
    chat_template: str | None = Field(default=None, min_length=1, max_length=65_536,
                                      description="A Jinja chat template replacing the model's own, for training "
                                                  "and the playground")
    requeue_on_worker_loss: bool = Field(
        default=True, description="When the worker running it is lost, queue the job again to resume from its "
                                  "newest checkpoint (or from its start, before the first) instead of failing it; "
                                  f"at most {MAX_REQUEUES} times")
    trackers: list[Tracker] = Field(
        default_factory=list, max_length=3,
        description="Experiment trackers the run is logged to (its spec, every step's metrics, links to its "
                    "artifacts): mlflow (the studio's tracking server), tensorboard (event files) and wandb (an "
                    "offline run), the last two kept as artifacts of the job")

    @field_validator("model")
    @classmethod
    def _model_reference(cls, value: str, info: ValidationInfo) -> str:
        if value == DEFAULT_MODEL_ID or HUB_ID.match(value):
            return value
        if value.startswith("builtin/"):
            if (info.context or {}).get(STORED):
                return value
            # any other builtin/ name would be read as a folder under DATA_DIR/models, `..` included
            raise ValueError(f"the built-in model is {DEFAULT_MODEL_ID}; there is no other built-in model")
        if value.startswith("/"):
            path = Path(value)
            if ".." in path.parts:
                raise ValueError("a local model path may not contain '..'")
            if (info.context or {}).get(STORED):
                return value
            folder = allowed_model_folder(value, get_settings())
            if folder is None:
                raise ValueError(f"no model folder at {value} that this studio may read: {NOT_ALLOWED}")
            try:
                found = folder.is_dir()
            except OSError:  # a name too long for the file system
                found = False
            if not found:
                raise ValueError(f"no model folder at {value} on this machine")
            return value
        raise ValueError("give builtin/SmolLM2-135M-Instruct, a hub id like Qwen/Qwen2.5-0.5B, or an absolute path")

    @field_validator("trackers")
    @classmethod
    def _trackers_set_up(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if repeated := sorted({name for name in value if value.count(name) > 1}):
            raise ValueError(f"{repeated[0]} is listed twice: name each tracker once")
        if "mlflow" in value and not (info.context or {}).get(STORED) and not get_settings().mlflow_tracking_uri:
            raise ValueError(MLFLOW_NOT_SET_UP)
        return value

    @field_validator("resume_from")
    @classmethod
    def _checkpoint_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip("."):
            raise ValueError("a checkpoint name, not '.' or '..'")
        return value

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
        if value.packing and (method in PREFERENCE_METHODS | REWARD_MODEL_METHODS or method in RL_METHODS):
            raise ValueError(f"packing does not apply to {method}: " + ("prompts to answer are never packed"
                             if method in RL_METHODS else "preference pairs are never packed"))
        engine_options = [name for name in ("memory_budget_gib", "offload_checkpoints") if getattr(value, name)]
        if engine_options:
            names = " and ".join(engine_options)
            if method not in MEMORY_ENGINE_METHODS:
                raise ValueError(f"{names}: the memory engine runs for {', '.join(sorted(MEMORY_ENGINE_METHODS))}, "
                                 f"not for {method}")
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
        if (method in ADAPTER_METHODS or method in RL_METHODS) and value is None:
            return LoraSettings()
        if method in REWARD_MODEL_METHODS and value is not None and isinstance(value.target_modules, list) \
                and "lm_head" in value.target_modules:
            # PEFT would skip it beside other targets and fail the job on it alone, after the queue
            raise ValueError("lora.target_modules: a reward model has no lm_head: its score head replaces it and is "
                             "always trained whole")
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

    @field_validator("grpo")
    @classmethod
    def _grpo_fits_method(cls, value: GrpoSettings | None, info: ValidationInfo):
        method, hp = info.data.get("method"), info.data.get("hyperparameters")
        if method is None:
            return value
        if method not in RL_METHODS:
            if value is not None:
                raise ValueError(f"grpo settings (reward functions, …) apply to grpo, not to {method}")
            return value
        if value is None:
            raise ValueError("grpo needs a grpo section with one reward function at least")
        if hp is not None and (hp.batch_size * hp.gradient_accumulation) % value.num_generations:
            raise ValueError(f"batch_size × gradient_accumulation ({hp.batch_size} × {hp.gradient_accumulation}) must "
                             f"be a multiple of num_generations ({value.num_generations}): each step scores whole "
                             "groups of completions")
        return value

    @field_validator("gpus")
    @classmethod
    def _quantised_bases_need_gpu(cls, value: int, info: ValidationInfo) -> int:
        if value == 0 and info.data.get("method") == "qlora":
            raise ValueError("qlora needs a GPU (4-bit weights): set gpus to 1 or more, or use lora")
        if value == 0 and info.data.get("method") == "lora_fp8":
            raise ValueError(FP8_NEEDS_GPU)
        grpo = info.data.get("grpo")
        if value == 0 and grpo is not None and grpo.load_in_4bit:
            raise ValueError("grpo's load_in_4bit needs a GPU (4-bit weights): set gpus to 1 or more, or turn it off")
        return value


def trains_adapter(spec: JobSpec) -> bool:
    """lora, qlora and lora_fp8 train a LoRA adapter, full and pretrain every weight; a preference method an
    adapter when its spec gives LoRA settings, every weight otherwise."""
    return spec.lora is not None


def quantized_base(spec: JobSpec) -> bool:
    """Whether the adapter trains over a 4-bit NF4 base: qlora, and grpo with load_in_4bit."""
    return spec.method == "qlora" or (spec.grpo is not None and spec.grpo.load_in_4bit)


def fp8_base(spec: JobSpec) -> bool:
    """Whether the adapter trains over an FP8 base (lora_fp8): exported merged into the original weights."""
    return spec.method == "lora_fp8"


def reward_model_refusal(job_id: int, reason: str) -> str:
    """Why a reward job's model is not exported or chatted with, in words."""
    return (f"Job {job_id} trained a reward model, which scores a prompt and answer with one number and writes no "
            f"text: {reason}. Use it as a GRPO reward function (kind reward_model), or download its adapter or model "
            "artifact (Hugging Face's AutoModelForSequenceClassification, num_labels=1).")


def stored_config(spec: JobSpec) -> dict[str, Any]:
    """What a training job's config holds: the validated spec (presets applied, defaults filled in)."""
    return {"version": SPEC_VERSION, "spec": spec.model_dump(mode="json")}


def load_spec(config: dict[str, Any] | None) -> JobSpec:
    """The spec of a training job's stored config; a UserError in words for a config this version of
    Lanner cannot read."""
    version = (config or {}).get("version")
    if version != SPEC_VERSION or not isinstance(config.get("spec"), dict):
        raise UserError(409, f"The job's stored spec is version {version!r}; this Lanner reads version "
                             f"{SPEC_VERSION} (`./lanner migrate` rewrites older stored jobs).")
    try:
        return JobSpec.model_validate(config["spec"], context={STORED: True})
    except ValidationError as error:
        raise UserError(409, f"The job's stored spec is not valid: {error}") from None


def shown_config(config: dict[str, Any]) -> dict[str, Any]:
    """A job's config as the API shows it: a training job's spec without its envelope; an export or
    chat job's options as stored."""
    if isinstance(config, dict) and set(config) == {"version", "spec"}:
        return config["spec"]
    return config
