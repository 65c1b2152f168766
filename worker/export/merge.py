"""Merged model: the adapter folded into a freshly loaded 16-bit copy of the base (never into
quantised weights: a QLoRA adapter trained on an NF4 base is merged into the original 16/32-bit
checkpoint, loaded here in the target dtype), saved as safetensors with tokenizer and chat template."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from .files import ExportError, ProgressFn, atomic_dir, ensure_free_space, no_progress, tree_size

DTYPES = ("bfloat16", "float16")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "tokenizer.model", "generation_config.json")


def count_parameters(model_dir: Path) -> int:
    """Parameters in a safetensors checkpoint, read from the file headers only."""
    from safetensors import safe_open

    total = 0
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ExportError(f"{model_dir} has no safetensors weights")
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                shape = handle.get_slice(name).get_shape()
                n = 1
                for dim in shape:
                    n *= dim
                total += n
    return total


def expected_merged_bytes(base_model_dir: Path) -> int:
    return 2 * count_parameters(base_model_dir)


def _refuse_quantised_base(base_model_dir: Path) -> None:
    config = json.loads((Path(base_model_dir) / "config.json").read_text())
    quant = config.get("quantization_config")
    if quant:
        raise ExportError(
            "The base checkpoint is stored quantised "
            f"({quant.get('quant_method', 'unknown method')}); merging into quantised weights loses "
            "the adapter's precision. Point the export at the original 16/32-bit base model.")


def load_tokenizer_source(base_model_dir: Path, adapter_dir: Path | None) -> Path:
    """The adapter's tokenizer when the trainer saved one (it may carry a chat template), else the base's."""
    if adapter_dir is not None and (Path(adapter_dir) / "tokenizer_config.json").is_file():
        return Path(adapter_dir)
    return Path(base_model_dir)


def export_merged(base_model_dir: Path, adapter_dir: Path, out_dir: Path, *, dtype: str = "bfloat16",
                  device: str = "cpu", progress: ProgressFn = no_progress, check_space: bool = True) -> dict:
    """Merge adapter_dir into base_model_dir loaded in `dtype` and save to out_dir (atomically)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ExportError(f"merged dtype must be one of {DTYPES}, not {dtype!r}")
    base_model_dir, adapter_dir, out_dir = Path(base_model_dir), Path(adapter_dir), Path(out_dir)
    _refuse_quantised_base(base_model_dir)
    if check_space:
        ensure_free_space(out_dir.parent, expected_merged_bytes(base_model_dir))
    progress("merge", 0.0)
    torch_dtype = getattr(torch, dtype)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch_dtype, device_map=device)
    progress("merge", 0.3)
    model = PeftModel.from_pretrained(base, adapter_dir)
    merged = model.merge_and_unload()
    merged.config.dtype = torch_dtype
    progress("merge", 0.6)
    tokenizer_dir = load_tokenizer_source(base_model_dir, adapter_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with atomic_dir(out_dir) as temp:
        merged.save_pretrained(temp, safe_serialization=True)
        tokenizer.save_pretrained(temp)
        for name in ("chat_template.jinja", "generation_config.json"):
            source = tokenizer_dir / name if (tokenizer_dir / name).is_file() else base_model_dir / name
            if source.is_file() and not (temp / name).is_file():
                shutil.copy2(source, temp / name)
        if not (temp / "chat_template.jinja").is_file() and not getattr(tokenizer, "chat_template", None):
            raise ExportError("The tokenizer has no chat template; the merged model would not chat.")
        progress("merge", 0.95)
    del merged, model, base
    progress("merge", 1.0)
    return {"format": "merged-safetensors", "path": str(out_dir), "dtype": dtype,
            "bytes": tree_size(out_dir)}
