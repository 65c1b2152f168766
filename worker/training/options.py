"""The training options a job's config may set, with their defaults. Unknown keys are ignored (the
API validates the spec; the worker reads what it knows)."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

ADAPTER_METHODS = ("lora", "qlora")
PREFERENCE_METHODS = ("dpo", "orpo", "kto")
LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", "target_modules")
# KTO estimates its KL term from the other completions of a micro-batch: it needs two at least.
SMALLEST_MICRO_BATCH = {"kto": 2}


@dataclass
class TrainingOptions:
    method: str = "lora"
    max_steps: int = -1                 # > 0 overrides num_train_epochs
    num_train_epochs: float = 1.0
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    learning_rate: float = 2e-4         # from_config: the method's default (the API's) when the config has none
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0           # used when warmup_steps is 0: a fraction of the total steps
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_seq_length: int = 1024
    packing: bool = False               # padding-free: samples packed into rows, attention within each (sft.py)
    completion_only_loss: bool = True   # loss on the answers only, not the prompts
    chat_template: str | None = None    # a Jinja chat template replacing the model's own
    lora: bool = True                   # train a LoRA adapter; False: every weight (see from_config)
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    target_modules: list[str] | None = None
    gradient_checkpointing: bool = True
    use_kernels: bool = True            # lanner.kernels on; off for comparison runs
    memory_budget_gib: float | None = None  # lora/qlora: the memory engine's budget (model.py, docs/memory-engine.md)
    offload_checkpoints: bool = False   # lora/qlora: layer inputs in host memory always (else when the budget needs it)
    dtype: str = "auto"                 # auto: bfloat16 on a GPU that has it, else float32
    seed: int = 42
    validation_split: float = 0.1       # taken only when the dataset has >= min_rows_for_validation rows
    min_rows_for_validation: int = 20
    eval_steps: int | None = None       # default: save_steps
    save_steps: int = 50
    dpo_beta: float = 0.1               # the beta of every preference method (ORPO's lambda, KTO's beta)
    max_prompt_len: int | None = None   # preference methods: longer prompts keep their end (common.truncate_prompts)
    oom_retry: bool = True              # on out of memory: once more at half the micro-batch, same effective batch
    memory_limit_mb: int | None = None  # a cap on what the training steps may allocate (lanner.worker.training.memory)

    @classmethod
    def from_config(cls, config: dict[str, Any] | None, method: str | None = None) -> "TrainingOptions":
        """The options of a job's config. `method` defaults to the config's own "method" key."""
        config = config or {}
        known = {field.name for field in fields(cls)}
        aliases = {"batch_size": "per_device_train_batch_size", "epochs": "num_train_epochs",
                   "lr": "learning_rate", "max_length": "max_seq_length", "r": "lora_r"}
        values = {}
        for key, value in config.items():
            key = aliases.get(key, key)
            if key in known and value is not None:
                values[key] = value
        method = method or config.get("method") or "lora"
        values["method"] = method
        values["lora"] = _trains_adapter(method, config)
        if "learning_rate" not in values:
            from lanner.core.spec import DEFAULT_LEARNING_RATE

            values["learning_rate"] = DEFAULT_LEARNING_RATE.get(method, cls.learning_rate)
        return cls(**values)

    def problem(self) -> str | None:
        """Why these options cannot train, in words; None when they can."""
        smallest = SMALLEST_MICRO_BATCH.get(self.method, 1)
        if self.per_device_train_batch_size < smallest:
            return (f"{self.method.upper()} needs a micro-batch (per_device_train_batch_size) of {smallest} or more: "
                    f"its KL term compares each completion with the others in its micro-batch.")
        return None

    def with_micro_batch(self, micro_batch: int) -> "TrainingOptions":
        """The same effective batch (micro-batch x accumulation) at a smaller micro-batch that divides it."""
        effective = self.per_device_train_batch_size * self.gradient_accumulation_steps
        assert effective % micro_batch == 0, (effective, micro_batch)
        return replace(self, per_device_train_batch_size=micro_batch,
                       gradient_accumulation_steps=effective // micro_batch)


def _trains_adapter(method: str, config: dict[str, Any]) -> bool:
    """lora and qlora train an adapter, full and pretrain every weight; a preference method trains an
    adapter when the job gives LoRA settings (the API's `lora` object, or the flat lora_* options) and
    every weight otherwise, as the API's memory estimate assumes."""
    if method in ADAPTER_METHODS:
        return True
    if method in PREFERENCE_METHODS:
        return config.get("lora") is not None or any(config.get(key) is not None for key in ("r", *LORA_KEYS))
    return False
