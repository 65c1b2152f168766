"""training jobs' configs as {"version": 1, "spec": {...}} (docs/job-spec.md)

Until now a training job's config held the API's nested spec and the training process's flat names
side by side (jobs queued through the API), or the flat names alone (jobs written straight into the
database, and the first versions' jobs). Each becomes the version 1 spec: the nested part as it is,
with the flat keys the worker read beyond it (requeue_on_worker_loss, chat_template,
memory_limit_mb, eval_steps, max_grad_norm, completion_only_loss) moved into it; a flat-only config
is translated with the defaults the worker gave it then, which differ from the spec's. Export and
chat jobs keep their own configs. A learning rate left out stays out: reading the spec fills in the
method's default, as the worker did.

The names and defaults below are a record of the old shape, frozen here on purpose: they must not
follow later changes to the spec.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""
from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

VERSION = 1
SPEC_FIELDS = ("method", "model", "dataset_id", "name", "preset", "hyperparameters", "lora", "preference",
               "priority", "gpus", "resume_from", "chat_template", "requeue_on_worker_loss")
# Flat keys the worker read that the old nested spec lacked: (flat name, spec section or None, field).
WORKER_ONLY = (("requeue_on_worker_loss", None, "requeue_on_worker_loss"), ("chat_template", None, "chat_template"),
               ("memory_limit_mb", "hyperparameters", "memory_limit_mb"),
               ("eval_steps", "hyperparameters", "eval_steps"), ("max_grad_norm", "hyperparameters", "max_grad_norm"),
               ("completion_only_loss", "hyperparameters", "completion_only_loss"))
OLD_SAVE_STEPS = 50
# The old training process's names and defaults (lanner.worker.training.options before version 1),
# with the aliases it accepted, as (flat names, its default, spec field).
OLD_HYPERPARAMETERS = (
    (("max_steps",), -1, "max_steps"), (("num_train_epochs", "epochs"), 1.0, "epochs"),
    (("per_device_train_batch_size", "batch_size"), 4, "batch_size"),
    (("gradient_accumulation_steps",), 1, "gradient_accumulation"), (("learning_rate", "lr"), None, "learning_rate"),
    (("lr_scheduler_type",), "linear", "lr_scheduler"), (("warmup_ratio",), 0.0, "warmup_ratio"),
    (("weight_decay",), 0.0, "weight_decay"), (("max_grad_norm",), 1.0, "max_grad_norm"),
    (("max_seq_length", "max_length"), 1024, "max_seq_len"), (("packing",), False, "packing"),
    (("completion_only_loss",), True, "completion_only_loss"),
    (("gradient_checkpointing",), True, "gradient_checkpointing"), (("use_kernels",), True, "use_kernels"),
    (("memory_budget_gib",), None, "memory_budget_gib"), (("offload_checkpoints",), False, "offload_checkpoints"),
    (("dtype",), "auto", "precision"), (("seed",), 42, "seed"), (("validation_split",), 0.1, "eval_fraction"),
    (("eval_steps",), None, "eval_steps"), (("save_steps",), OLD_SAVE_STEPS, "save_steps"), (("oom_retry",), True, "oom_retry"),
    (("memory_limit_mb",), None, "memory_limit_mb"), (("before_after_eval",), True, "before_after_eval"))
OLD_LORA = ((("lora_r", "r"), 16, "rank"), (("lora_alpha",), 16, "alpha"), (("lora_dropout",), 0.0, "dropout"),
            (("target_modules",), None, "target_modules"))
PRECISION = {"auto": "auto", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
ADAPTER_METHODS, PREFERENCE_METHODS = ("lora", "qlora"), ("dpo", "orpo", "kto")

jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("kind", sa.String), sa.column("method", sa.String),
                sa.column("model", sa.String), sa.column("dataset_id", sa.Integer), sa.column("name", sa.String),
                sa.column("priority", sa.Integer), sa.column("gpus", sa.Integer),
                sa.column("resume_from", sa.String), sa.column("config", sa.JSON))


def _flat(config: dict[str, Any], names: tuple[str, ...], default: Any) -> Any:
    return next((config[name] for name in names if config.get(name) is not None), default)


def _nested_spec(config: dict[str, Any]) -> dict[str, Any]:
    spec = {key: config[key] for key in SPEC_FIELDS if key in config}
    hp = spec["hyperparameters"] = dict(spec["hyperparameters"] or {})
    if hp.get("save_steps") is None:  # the old spec left it empty; the worker saved every 50 steps
        hp["save_steps"] = OLD_SAVE_STEPS
    for flat, section, field in WORKER_ONLY:
        if config.get(flat) is not None:
            target = spec if section is None else spec.setdefault(section, {})
            target.setdefault(field, config[flat])
    return spec


def _flat_spec(config: dict[str, Any], job) -> dict[str, Any]:
    hp = {field: _flat(config, names, default) for names, default, field in OLD_HYPERPARAMETERS}
    nested_eval = (config.get("hyperparameters") or {}).get("before_after_eval")
    hp["before_after_eval"] = _flat(config, ("before_after_eval",), True if nested_eval is None else nested_eval)
    hp["max_steps"] = hp["max_steps"] if hp["max_steps"] > 0 else None
    hp["precision"] = PRECISION.get(hp["precision"], hp["precision"])
    if hp["learning_rate"] is None:
        del hp["learning_rate"]
    spec = {"method": job.method, "model": job.model, "dataset_id": job.dataset_id, "name": job.name,
            "priority": job.priority, "gpus": job.gpus, "resume_from": job.resume_from, "hyperparameters": hp,
            "chat_template": config.get("chat_template"),
            "requeue_on_worker_loss": bool(config.get("requeue_on_worker_loss", False)),
            "lora": None, "preference": None}
    lora_given = any(config.get(name) is not None for names, _, _ in OLD_LORA for name in names)
    if job.method in ADAPTER_METHODS or (job.method in PREFERENCE_METHODS and lora_given):
        spec["lora"] = {field: _flat(config, names, default) for names, default, field in OLD_LORA}
        spec["lora"]["target_modules"] = spec["lora"]["target_modules"] or "all-linear"
    if job.method in PREFERENCE_METHODS:
        spec["preference"] = {"beta": _flat(config, ("dpo_beta",), 0.1), "max_prompt_len": config.get("max_prompt_len")}
    return spec


def upgrade() -> None:
    connection = op.get_bind()
    for job in connection.execute(sa.select(jobs).where(jobs.c.kind == "train")).all():
        config = dict(job.config or {})
        if set(config) == {"version", "spec"}:
            continue
        spec = _nested_spec(config) if "hyperparameters" in config else _flat_spec(config, job)
        connection.execute(jobs.update().where(jobs.c.id == job.id).values(config={"version": VERSION, "spec": spec}))


def _old_flat_names(spec: dict[str, Any]) -> dict[str, Any]:
    """The flat names the training process read before version 1 (core.spec.worker_options then)."""
    hp = spec.get("hyperparameters") or {}
    flat = {"num_train_epochs": hp.get("epochs"), "per_device_train_batch_size": hp.get("batch_size"),
            "gradient_accumulation_steps": hp.get("gradient_accumulation"), "learning_rate": hp.get("learning_rate"),
            "lr_scheduler_type": hp.get("lr_scheduler"), "weight_decay": hp.get("weight_decay"),
            "max_seq_length": hp.get("max_seq_len"), "packing": hp.get("packing"),
            "gradient_checkpointing": hp.get("gradient_checkpointing"), "seed": hp.get("seed"),
            "dtype": {value: key for key, value in PRECISION.items()}.get(hp.get("precision"), "auto"),
            "validation_split": hp.get("eval_fraction"), "warmup_ratio": hp.get("warmup_ratio"),
            "use_kernels": hp.get("use_kernels"), "oom_retry": hp.get("oom_retry"),
            "memory_budget_gib": hp.get("memory_budget_gib"), "offload_checkpoints": hp.get("offload_checkpoints"),
            "max_steps": hp.get("max_steps"), "save_steps": hp.get("save_steps"),
            "memory_limit_mb": hp.get("memory_limit_mb"), "eval_steps": hp.get("eval_steps"),
            "max_grad_norm": hp.get("max_grad_norm"), "completion_only_loss": hp.get("completion_only_loss"),
            "requeue_on_worker_loss": spec.get("requeue_on_worker_loss"), "chat_template": spec.get("chat_template")}
    if spec.get("lora"):
        lora = spec["lora"]
        flat.update(lora_r=lora.get("rank"), lora_alpha=lora.get("alpha"), lora_dropout=lora.get("dropout"),
                    target_modules=None if lora.get("target_modules") == "all-linear" else lora.get("target_modules"))
    if spec.get("preference"):
        flat.update(dpo_beta=spec["preference"].get("beta"), max_prompt_len=spec["preference"].get("max_prompt_len"))
    return {key: value for key, value in flat.items() if value is not None}


def downgrade() -> None:
    connection = op.get_bind()
    for job in connection.execute(sa.select(jobs).where(jobs.c.kind == "train")).all():
        config = dict(job.config or {})
        if set(config) != {"version", "spec"}:
            continue
        spec = config["spec"]
        connection.execute(jobs.update().where(jobs.c.id == job.id).values(config={**spec, **_old_flat_names(spec)}))
