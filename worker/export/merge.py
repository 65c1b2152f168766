"""Merged model: the adapter folded into a freshly loaded copy of the base, saved in 16 bits as
safetensors with tokenizer and chat template. Never into quantised weights, and every weight rounded
to 16 bits once: a LoRA adapter is merged into the base checkpoint loaded in float32 (which holds a
16- or 32-bit checkpoint exactly), then the sum is cast to the target dtype; a QLoRA adapter into the
base its training saw, quantised to 4 bits and dequantised once (dequantize.py), each layer merged
in float32 and rounded to 16 bits once. A job that trained every weight has nothing to merge: its model is saved in 16 bits
with the same files (export_whole_model)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from lanner.core.export_spec import MERGED_DTYPES
from lanner.worker.checkpoints import base_load_kwargs

from .dequantize import Quantization, quantised_expert_stacks, quantised_linears, round_trip
from .files import ExportError, ProgressFn, atomic_dir, ensure_free_space, no_progress, tree_size

# Copied beside what tokenizer.save_pretrained writes (transformers 5 no longer writes tokenizer.model,
# which the GGUF converter reads SentencePiece scores from).
EXTRA_FILES = ("chat_template.jinja", "generation_config.json", "tokenizer.model")


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


def load_adapter(base, adapter_dir: Path):
    """PeftModel.from_pretrained(base, adapter_dir), with what PEFT refuses (an adapter made for another model,
    a config it cannot read) and what it cannot merge refused as an ExportError in words."""
    from peft import PeftModel

    try:
        model = PeftModel.from_pretrained(base, adapter_dir)
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ExportError(f"The adapter does not load onto its base model ({type(error).__name__}: "
                          f"{str(error).strip()[:500]}); was it trained on another model?") from error
    _refuse_unmergeable(model)
    return model


def _refuse_unmergeable(model) -> None:
    """What PEFT's merge raises on, in words: a bias trained on lora_B (lora_bias) of a layer without a bias."""
    from peft.tuners.lora import LoraLayer

    bias_less = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                        if isinstance(module, LoraLayer) and any(getattr(module, "lora_bias", {}).values())
                        and getattr(module.get_base_layer(), "bias", None) is None})
    if bias_less:
        raise ExportError(f"The adapter trains a bias (lora_bias) on {', '.join(bias_less)}, which have no bias in the "
                          "base model: a merged model of this architecture has no place for it. Train without "
                          "lora_bias to export a merged model or a GGUF.")


def _innermost(module):
    """The module a PEFT wrapper (LoRA layer, modules_to_save, trainable tokens) wraps, or module itself."""
    import torch

    for _ in range(16):
        inner = getattr(module, "base_layer", None)
        if not isinstance(inner, torch.nn.Module):
            inner = getattr(module, "original_module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        module = inner
    return module


def _set_tied(config, tied: bool) -> None:
    config.tie_word_embeddings = tied
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:
        text.tie_word_embeddings = tied


def untie_adapted_embeddings_(model) -> bool:
    """Before a merge. A base that ties its output embedding (lm_head) to the input one holds one tensor for both;
    an adapter on either (LoRA on lm_head or embed_tokens, modules_to_save, trainable tokens) changes one of them
    only, and PEFT's merge writes its delta into the shared tensor, so into both: the merged model would not be
    the adapted one. The output embedding gets its own copy of the weight (and the config says untied; see
    retie_embeddings_). Returns whether it did."""
    import torch

    base = model.get_base_model()
    inputs, outputs = base.get_input_embeddings(), base.get_output_embeddings()
    if inputs is None or outputs is None:
        return False
    inner_in, inner_out = _innermost(inputs), _innermost(outputs)
    weight = getattr(inner_out, "weight", None)
    if weight is None or weight is not getattr(inner_in, "weight", None) or (inputs is inner_in and outputs is inner_out):
        return False
    inner_out.weight = torch.nn.Parameter(weight.detach().clone(), requires_grad=False)
    _set_tied(base.config, False)
    return True


def retie_embeddings_(merged) -> None:
    """After a merge that untied the embeddings (untie_adapted_embeddings_): tied again where the merged output
    embedding equals the input one (the adapter changed neither's values), as the base was; else saved untied."""
    import torch

    inputs, outputs = merged.get_input_embeddings(), merged.get_output_embeddings()
    if torch.equal(inputs.weight, outputs.weight):
        outputs.weight = inputs.weight
        _set_tied(merged.config, True)


def merge_in_float32(model):
    """merge_and_unload of a PeftModel, with the embeddings a tied base shares untied where the adapter changes
    one of them (and tied again where it changed neither)."""
    untied = untie_adapted_embeddings_(model)
    merged = model.merge_and_unload()
    if untied:
        retie_embeddings_(merged)
    return merged


def _merge_into_dequantised(base, adapter_dir: Path, quantization: Quantization, dtype):
    """The base with each quantised weight (linear layers, and stacked experts where training held them in
    4 bits) replaced by its 4-bit round trip, plus the adapter's delta on it and on any 16-bit expert stack it
    adapts: weight by weight in float32 (one at a time: memory stays at the loaded model), each rounded to
    `dtype` once."""
    import torch
    from peft.tuners.lora import LoraLayer, ParamWrapper

    quantised = [(linear, "weight") for linear in quantised_linears(base)]
    quantised += quantised_expert_stacks(base, quantization)
    model = load_adapter(base, adapter_dir)
    untied = untie_adapted_embeddings_(model)
    # Each LoRA layer by the weight it adapts: a linear's weight, or one parameter of an experts module
    # (PEFT nests one ParamWrapper per adapted parameter around it).
    lora_of = {(id(m.get_base_layer()), m.parameter_name if isinstance(m, ParamWrapper) else "weight"): m
               for m in model.modules() if isinstance(m, LoraLayer)}
    keys = {(id(module), name) for module, name in quantised}
    # The adapted weights training held in 16 bits (lm_head, embeddings, experts not stored in NF4): merged in
    # float32 too.
    sixteen_bit = [(m.get_base_layer(), key[1]) for key, m in lora_of.items() if key not in keys]
    source_dtype = base.dtype  # loaded in the dtype training quantised from
    with torch.no_grad():
        for module, name in quantised + sixteen_bit:
            weight = getattr(module, name)
            weight.data = (round_trip(weight, quantization, source_dtype) if (id(module), name) in keys
                           else weight.data.float())
            if (id(module), name) in lora_of:
                lora_of[id(module), name].merge()
            weight.data = weight.data.to(dtype)
    merged_layers = sum(1 for m in lora_of.values() if m.merged)
    if merged_layers != len(lora_of):
        raise ExportError(f"Only {merged_layers} of the adapter's {len(lora_of)} layers could be merged into the base.")
    merged = model.unload().to(dtype)
    if untied:
        retie_embeddings_(merged)
    return merged


def _start(source_dir: Path, out_dir: Path, dtype: str, check_space: bool, progress: ProgressFn):
    """What both 16-bit saves check first (a 16-bit dtype, an unquantised source checkpoint, room on
    the disk); returns the torch dtype to save in."""
    import torch

    if dtype not in MERGED_DTYPES:
        raise ExportError(f"merged dtype must be one of {MERGED_DTYPES}, not {dtype!r}")
    _refuse_quantised_base(source_dir)
    if check_space:
        ensure_free_space(out_dir.parent, expected_merged_bytes(source_dir))
    progress("merge", 0.0)
    return getattr(torch, dtype)


def export_merged(base_model_dir: Path, adapter_dir: Path, out_dir: Path, *, dtype: str = "bfloat16",
                  device: str = "cpu", quantization: Quantization | None = None,
                  progress: ProgressFn = no_progress, check_space: bool = True) -> dict:
    """Merge adapter_dir into base_model_dir in float32, round to `dtype` once and save to out_dir
    (atomically). quantization: how QLoRA training quantised the base (None for a LoRA adapter)."""
    import torch
    from transformers import AutoModelForCausalLM

    base_model_dir, adapter_dir, out_dir = Path(base_model_dir), Path(adapter_dir), Path(out_dir)
    torch_dtype = _start(base_model_dir, out_dir, dtype, check_space, progress)
    # A QLoRA base is loaded in the dtype its weights were quantised from: the 4-bit codes depend on it.
    # A LoRA base in float32: merged in the target dtype, each weight would be rounded twice (the base
    # on load, the sum again), which moves the logits about twice as far as the one rounding that
    # saving in 16 bits must cost (docs/export.md, "The merged model's bound").
    load_dtype = torch.float32 if quantization is None else quantization.source_dtype(base_model_dir)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=load_dtype, device_map=device,
                                                **base_load_kwargs(base_model_dir))
    progress("merge", 0.3)
    if quantization is None:
        model = load_adapter(base, adapter_dir)
        merged = merge_in_float32(model).to(torch_dtype)
    else:
        model = merged = _merge_into_dequantised(base, adapter_dir, quantization, torch_dtype)
    merged.config.dtype = torch_dtype
    progress("merge", 0.6)
    info = _save_16bit(merged, load_tokenizer_source(base_model_dir, adapter_dir), base_model_dir, out_dir, progress)
    info.update(format="merged-safetensors", dtype=dtype)
    del merged, model, base
    progress("merge", 1.0)
    if quantization is not None:
        info["merged_into"] = {"dequantised_base": quantization.as_dict()}
    return info


def export_whole_model(model_dir: Path, out_dir: Path, *, base_model_dir: Path | None = None,
                       dtype: str = "bfloat16", device: str = "cpu", progress: ProgressFn = no_progress,
                       check_space: bool = True) -> dict:
    """A model whose every weight was trained (full fine-tuning, continued pretraining) saved in
    `dtype` with its tokenizer and chat template, as a merged model is: nothing to merge. Files the
    trainer does not write (tokenizer.model) come from base_model_dir, the checkpoint it trained from."""
    from transformers import AutoModelForCausalLM

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    torch_dtype = _start(model_dir, out_dir, dtype, check_space, progress)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, device_map=device)
    model.config.dtype = torch_dtype
    progress("merge", 0.6)
    info = _save_16bit(model, model_dir, Path(base_model_dir or model_dir), out_dir, progress)
    del model
    progress("merge", 1.0)
    info.update(format="model-safetensors", dtype=dtype)
    return info


def _save_16bit(model, tokenizer_dir: Path, base_model_dir: Path, out_dir: Path, progress: ProgressFn) -> dict:
    """model, its tokenizer (from tokenizer_dir) and EXTRA_FILES (from tokenizer_dir, else base_model_dir)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with atomic_dir(out_dir) as temp:
        model.save_pretrained(temp, safe_serialization=True)
        tokenizer.save_pretrained(temp)
        for name in EXTRA_FILES:
            source = tokenizer_dir / name if (tokenizer_dir / name).is_file() else base_model_dir / name
            if source.is_file() and not (temp / name).is_file():
                shutil.copy2(source, temp / name)
        if not (temp / "chat_template.jinja").is_file() and not getattr(tokenizer, "chat_template", None):
            raise ExportError("The tokenizer has no chat template; the merged model would not chat.")
        progress("merge", 0.95)
    return {"path": str(out_dir), "bytes": tree_size(out_dir)}
