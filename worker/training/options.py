"""The training options a job's config may set, with their defaults. Unknown keys are ignored (the
API validates the spec; the worker reads what it knows)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class TrainingOptions:
    max_steps: int = -1                 # > 0 overrides num_train_epochs
    num_train_epochs: float = 1.0
    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    learning_rate: float = 2e-4
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0           # used when warmup_steps is 0: a fraction of the total steps
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_seq_length: int = 1024
    packing: bool = False
    completion_only_loss: bool = True   # loss on the answers only, not the prompts
    chat_template: str | None = None    # a Jinja chat template replacing the model's own
    lora_r: int = 16
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    target_modules: list[str] | None = None
    gradient_checkpointing: bool = True
    use_kernels: bool = True            # lanner.kernels on; off for comparison runs
    dtype: str = "auto"                 # auto: bfloat16 on a GPU that has it, else float32
    seed: int = 42
    validation_split: float = 0.1       # taken only when the dataset has >= min_rows_for_validation rows
    min_rows_for_validation: int = 20
    eval_steps: int | None = None       # default: save_steps
    save_steps: int = 50
    dpo_beta: float = 0.1

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> "TrainingOptions":
        known = {field.name for field in fields(cls)}
        aliases = {"batch_size": "per_device_train_batch_size", "epochs": "num_train_epochs",
                   "lr": "learning_rate", "max_length": "max_seq_length", "r": "lora_r"}
        values = {}
        for key, value in (config or {}).items():
            key = aliases.get(key, key)
            if key in known and value is not None:
                values[key] = value
        return cls(**values)
