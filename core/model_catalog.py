"""The models a job can start from: the built-in default, a curated list of common bases, and
checkpoints already on this machine."""
from __future__ import annotations

import json
from pathlib import Path

from lanner.core import default_model  # imports no torch
from lanner.core.default_model import DEFAULT_MODEL_ID
from lanner.core.memory_estimate import count_parameters, countable_shape, estimate_memory
from lanner.core.spec import JobSpec

# (hub id, family, parameters in billions, needs an access request on the hub)
CURATED: list[tuple[str, str, float, bool]] = [
    ("HuggingFaceTB/SmolLM2-135M-Instruct", "SmolLM2", 0.135, False),
    ("HuggingFaceTB/SmolLM2-360M-Instruct", "SmolLM2", 0.36, False),
    ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "SmolLM2", 1.7, False),
    ("meta-llama/Llama-3.2-1B-Instruct", "Llama 3.2", 1.24, True),
    ("meta-llama/Llama-3.2-3B-Instruct", "Llama 3.2", 3.21, True),
    ("meta-llama/Llama-3.1-8B-Instruct", "Llama 3.1", 8.03, True),
    ("meta-llama/Llama-3.3-70B-Instruct", "Llama 3.3", 70.6, True),
    ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen 2.5", 0.49, False),
    ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen 2.5", 1.54, False),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen 2.5", 7.62, False),
    ("Qwen/Qwen2.5-14B-Instruct", "Qwen 2.5", 14.7, False),
    ("Qwen/Qwen2.5-32B-Instruct", "Qwen 2.5", 32.8, False),
    ("Qwen/Qwen3-0.6B", "Qwen 3", 0.6, False),
    ("Qwen/Qwen3-1.7B", "Qwen 3", 1.7, False),
    ("Qwen/Qwen3-4B", "Qwen 3", 4.0, False),
    ("Qwen/Qwen3-8B", "Qwen 3", 8.2, False),
    ("Qwen/Qwen3-14B", "Qwen 3", 14.8, False),
    ("Qwen/Qwen3-32B", "Qwen 3", 32.8, False),
    ("mistralai/Mistral-7B-Instruct-v0.3", "Mistral", 7.25, True),
    ("mistralai/Mistral-Nemo-Instruct-2407", "Mistral", 12.2, True),
    ("google/gemma-2-2b-it", "Gemma 2", 2.61, True),
    ("google/gemma-2-9b-it", "Gemma 2", 9.24, True),
    ("google/gemma-2-27b-it", "Gemma 2", 27.2, True),
    ("google/gemma-3-1b-it", "Gemma 3", 1.0, True),
    ("google/gemma-3-4b-it", "Gemma 3", 4.3, True),
    ("google/gemma-3-12b-it", "Gemma 3", 12.2, True),
    ("google/gemma-3-27b-it", "Gemma 3", 27.4, True),
    ("microsoft/Phi-3-mini-4k-instruct", "Phi-3", 3.82, False),
    ("microsoft/Phi-3-medium-4k-instruct", "Phi-3", 14.0, False),
    ("microsoft/Phi-4-mini-instruct", "Phi-4", 3.84, False),
    ("microsoft/phi-4", "Phi-4", 14.7, False),
    # Mixtures of experts (the parameters are all the experts'; a token uses a few of them).
    ("Qwen/Qwen3-30B-A3B", "Qwen 3 MoE", 30.5, False),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen 3 MoE", 30.5, False),
    ("openai/gpt-oss-20b", "gpt-oss", 20.9, False),
    ("openai/gpt-oss-120b", "gpt-oss", 116.8, False),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral", 46.7, True),
]


def catalog_entries() -> list[dict]:
    return [{"id": hub_id, "family": family, "parameters": int(billions * 1e9), "gated": gated, "source": "hub"}
            for hub_id, family, billions, gated in CURATED]


def local_models(models_dir: Path) -> list[dict]:
    """Folders under DATA_DIR/models holding a Hugging Face checkpoint (a config.json)."""
    if not models_dir.is_dir():
        return []
    found = []
    for config in sorted(models_dir.glob("*/config.json")) + sorted(models_dir.glob("*/*/config.json")):
        folder = config.parent
        found.append({"id": str(folder), "name": str(folder.relative_to(models_dir)), "source": "local"})
    return found


BUILTIN_PARAMETERS = count_parameters(default_model.SHAPE)["total"]


def model_shape(model: str, models_dir: Path) -> dict | None:
    """The built-in model's shape (known whether or not it is imported yet); else the model's
    config.json when it is on this machine, else its parameter count when the catalog knows it, else
    None (an unknown hub model: no estimate)."""
    if model == DEFAULT_MODEL_ID:
        return dict(default_model.SHAPE)
    folder = Path(model) if model.startswith("/") else models_dir / model
    known = {hub_id: billions for hub_id, _, billions, _ in CURATED}
    fallback = {"parameters": int(known[model] * 1e9)} if model in known else None
    config = folder / "config.json"
    if config.is_file():
        try:
            shape = json.loads(config.read_text())
            if countable_shape(shape):
                return shape
        except (OSError, ValueError):
            pass
    return fallback


def estimate_job_memory(spec: JobSpec, models_dir: Path, gpu_bytes: int | None = None,
                        longest_row: int | None = None, reward_models: list[str] = ()) -> dict | None:
    """lanner.core.memory_estimate's estimate for a job spec on the device its gpus ask for (a GPU of
    gpu_bytes, when known: the job has it to itself), with its dataset's longest row when measured and
    the base models of the reward models a GRPO job scores with; None when the model's size, or a
    reward model's, is unknown."""
    shape = model_shape(spec.model, models_dir)
    scorers = [model_shape(model, models_dir) for model in reward_models]
    if shape is None or None in scorers:
        return None
    return estimate_memory(spec, shape, "cuda" if spec.gpus else "cpu", gpu_bytes if spec.gpus else None,
                           longest_row, scorers)
