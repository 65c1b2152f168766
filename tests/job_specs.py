"""Training jobs' stored configs for tests that make jobs directly in the database: the spec the API
would have stored (lanner.core.spec.stored_config), from nested overrides."""
from __future__ import annotations

from typing import Any

from lanner.core.spec import WHOLE_MODEL_METHODS, Hyperparameters, JobSpec, LoraSettings, stored_config

BUILTIN = "builtin/SmolLM2-135M-Instruct"


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` over `base`, nested dicts key by key; a None replaces (lora=None: no LoRA settings)."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def stored_spec(method: str = "lora", base: dict[str, Any] | None = None, overrides: dict[str, Any] | None = None,
                *, model: str = BUILTIN, dataset_id: int | None = None, gpus: int = 0) -> dict[str, Any]:
    """A stored spec of `base` with `overrides` merged in. A whole-model method drops the base's LoRA
    settings; a qlora or lora_fp8 spec asks for a GPU, as the API has it (the tests run it on the CPU: the worker
    places a job by its own gpus column)."""
    data = merged(base or {}, overrides or {})
    if method in WHOLE_MODEL_METHODS and base and "lora" in base and "lora" not in (overrides or {}):
        data.pop("lora")
    spec = JobSpec.model_validate({**data, "method": method, "model": model, "dataset_id": dataset_id or 1,
                                   "gpus": max(gpus, 1) if method in ("qlora", "lora_fp8") else gpus})
    return stored_config(spec)


def unchecked_spec(method: str = "lora", lora: dict[str, Any] | None = None, **hyperparameters) -> JobSpec:
    """A spec of these fields without the API's checks (a memory estimate reads whatever it is given),
    the other fields at their defaults; a whole-model method has no LoRA settings."""
    return JobSpec.model_construct(
        method=method, model=BUILTIN, dataset_id=1, hyperparameters=Hyperparameters.model_construct(**hyperparameters),
        lora=None if method in WHOLE_MODEL_METHODS else LoraSettings.model_construct(**(lora or {})))
