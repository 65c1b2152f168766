"""Verification stored with every export: does the file behave like the model that was trained?

1. Merged vs base-with-adapter (PEFT, unmerged, float32): logits on fixed prompts. The bound is
   what one cast to 16 bits costs, measured on the same prompts rather than guessed: the adapter is
   merged into the float32 base here too and every weight of that sum cast to the merged dtype once
   (what a right export saves); its logits' distance from the reference is `noise_floor`. The merged
   model must stay within MERGED_NOISE_FACTOR x noise_floor (+ a tiny absolute slack) of the
   reference, and agree on the top-1 token at every position except exact near-ties and the changes the
   one-cast model makes too (docs/export.md, "The merged model's bound", has the derivation and the numbers).
   The float32 merge the floor is measured on must itself be the reference (within FLOAT32_MERGE_BOUND and a share
   of the adapter's effect): a merge
   gone wrong (e.g. a delta written into an embedding a tied base shares) would otherwise set its own floor.
2. f16 GGUF in llama.cpp vs the merged model (transformers, float32 compute on the 16-bit weights):
   same tokenization, same top-1 token at every position (near-ties excepted and counted), mean
   KL(merged || gguf) below F16_KL_BOUND.
3. Other GGUF types (q8_0, k-quants): load in llama.cpp and generate; KL against the merged model is
   measured and reported, and bounded for q8_0 (Q8_0_KL_BOUND).
4. An adapter trained over an FP8 base (lora_fp8), merged into the original 16-bit weights: the merged
   model's logits against the FP8-trained model's (the FP8 base + the adapter), within twice the base's
   own FP8 gap (16-bit vs FP8, no adapter) plus check 1's bound (docs/fp8.md derives it); reported
   beside check 1, not a condition of keeping the merged files.
A whole trained model (no adapter) saved in 16 bits is checked instead by its weights: each tensor is
the trained one rounded to the 16-bit dtype, bit for bit; its logits against the trained model's
(float32) are reported, with the top-1 token required to agree except at near-ties.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lanner.worker.checkpoints import base_load_kwargs

MERGED_NOISE_FACTOR = 1.25  # a right merge sits at 1.0; a second rounding at 1.5-2 (docs/export.md)
MERGED_ABS_SLACK = 1e-3
# The float32 merge vs the unmerged adapter differs by float32's rounding of W + BA only; a merge gone wrong misses
# a good part of the adapter's effect. Bound: an absolute slack plus a share of that effect (deep models' float32
# noise grows with depth; a fixed bound would fail right merges of large ones).
FLOAT32_MERGE_BOUND = 1e-3
FLOAT32_MERGE_EFFECT_SHARE = 0.01
F16_KL_BOUND = 1e-3        # nats per position
Q8_0_KL_BOUND = 2e-2       # nats per position
TIE_MARGIN = 0.05          # logits: a top-1 flip is a near-tie if the reference's own gap is below this

TEXT_PROMPTS = (
    "The capital of France is Paris. The capital of Italy is",
    "def add(a, b):\n    return",
)
CHAT_SYSTEM = "Answer briefly."  # a short system turn keeps the prompt short (the default one is long)
CHAT_QUESTION = "What is the largest planet?"


def prompt_ids(tokenizer, texts: Sequence[str] = TEXT_PROMPTS) -> list[list[int]]:
    """Token ids of the prompts: plain texts (the fixed ones unless given) and one chat turn through
    the chat template."""
    ids = [tokenizer(text, add_special_tokens=True)["input_ids"] for text in texts]
    if getattr(tokenizer, "chat_template", None):
        chat = tokenizer.apply_chat_template([{"role": "system", "content": CHAT_SYSTEM},
                                              {"role": "user", "content": CHAT_QUESTION}],
                                             add_generation_prompt=True, tokenize=True)
        if isinstance(chat, dict) or hasattr(chat, "keys"):
            chat = chat["input_ids"]
        ids.append(list(chat))
    return ids


def _logits(model, ids_list: list[list[int]]) -> list[np.ndarray]:
    """Float32 logits of each prompt, all prompts in one right-padded batch (causal attention: the
    padding after a prompt cannot change its logits)."""
    import torch

    device = next(model.parameters()).device
    longest = max(len(ids) for ids in ids_list)
    input_ids = torch.zeros((len(ids_list), longest), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(ids_list):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    with torch.no_grad():
        logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits.float().cpu().numpy()
    return [logits[row, : len(ids)] for row, ids in enumerate(ids_list)]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _top1_changes(ref: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position of two equally long logit arrays: cand's top-1 token, whether it is not ref's, and whether
    that change is a near-tie (ref's own gap between the two tokens below TIE_MARGIN)."""
    top_ref, top_cand = ref.argmax(-1), cand.argmax(-1)
    changed = top_ref != top_cand
    gap = ref[np.arange(len(ref)), top_ref] - ref[np.arange(len(ref)), top_cand]
    return top_cand, changed, changed & (gap < TIE_MARGIN)


def compare_logits(reference: list[np.ndarray], candidate: list[np.ndarray]) -> dict:
    """Max/mean |diff|, top-1 agreement (with near-ties counted apart) and mean KL(ref || cand)."""
    max_diff, abs_sum, count, agree, ties, kl_sum = 0.0, 0.0, 0, 0, 0, 0.0
    for ref, cand in zip(reference, candidate):
        n = min(len(ref), len(cand))
        ref, cand = ref[:n], cand[:n]
        diff = np.abs(ref - cand)
        max_diff = max(max_diff, float(diff.max()))
        abs_sum += float(diff.mean()) * n
        _, changed, near_tie = _top1_changes(ref, cand)
        agree += int((~changed).sum())
        ties += int(near_tie.sum())
        p, q = _log_softmax(ref), _log_softmax(cand)
        kl_sum += float((np.exp(p) * (p - q)).sum(-1).sum())
        count += n
    return {"positions": count, "max_abs_logit_diff": max_diff, "mean_abs_logit_diff": abs_sum / count,
            "top1_agreement": agree / count, "top1_mismatches": count - agree,
            "top1_mismatches_near_ties": ties, "mean_kl": kl_sum / count}


def verify_merged(base_model_dir: Path, adapter_dir: Path, merged_dir: Path, *, device: str = "cpu",
                  quantization=None, return_reference: bool = False, texts: Sequence[str] = TEXT_PROMPTS):
    """Compare the merged 16-bit model with base + adapter (PEFT, unmerged, float32) on `texts` and a
    chat turn. For a QLoRA adapter (quantization set) the base is the 4-bit one training saw,
    dequantised exactly: the 4-bit base with its adapter. Returns the JSON-able result; with
    return_reference, also the merged model's prompt ids and logits (the reference of the GGUF checks)
    as a second value."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .merge import load_adapter, merge_in_float32

    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    ids = prompt_ids(tokenizer, texts)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32, device_map=device,
                                                **base_load_kwargs(base_model_dir))
    if quantization is not None:
        from .dequantize import dequantise_base_

        dequantise_base_(base, quantization, quantization.source_dtype(base_model_dir))
    model = load_adapter(base, adapter_dir)
    model.eval()
    reference = _logits(model, ids)
    with model.disable_adapter():
        base32 = _logits(model, ids)
    dtype = _merged_dtype(merged_dir)
    one_cast = merge_in_float32(model)  # in float32: the exact sum, as the export merges it
    # The floor below is measured on this merge: it must be the adapted model itself before any rounding, or
    # the floor measures a wrong merge (one PEFT's merge got wrong would pass its own floor).
    merge32 = compare_logits(reference, _logits(one_cast, ids))
    with torch.no_grad():
        for param in one_cast.parameters():
            param.data = param.data.to(dtype).float()
    cast_logits = _logits(one_cast, ids)
    del model, base, one_cast
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, device_map=device)
    merged.eval()
    merged_logits = _logits(merged, ids)
    del merged

    noise = compare_logits(reference, cast_logits)
    result = compare_logits(reference, merged_logits)
    adapter_effect = compare_logits(base32, reference)
    bound = MERGED_NOISE_FACTOR * noise["max_abs_logit_diff"] + MERGED_ABS_SLACK
    merge32_bound = FLOAT32_MERGE_BOUND + FLOAT32_MERGE_EFFECT_SHARE * adapter_effect["max_abs_logit_diff"]
    # A top-1 change the one-cast model makes too (same position, same token) is what one rounding costs (a
    # mixture of experts routing a nearly tied token elsewhere): the right export makes it, bit for bit.
    as_one_cast = _top1_changes_as_one_cast(reference, merged_logits, cast_logits)
    result.update(
        check="merged (16-bit, float32 compute) vs base + adapter (PEFT, float32)" if quantization is None else
              "merged (16-bit, float32 compute) vs 4-bit base (dequantised, float32) + adapter (PEFT, float32)",
        merged_dtype=str(dtype).replace("torch.", ""),
        noise_floor_max_abs_logit_diff=noise["max_abs_logit_diff"],
        bound_max_abs_logit_diff=bound,
        float32_merge_max_abs_logit_diff=merge32["max_abs_logit_diff"],
        float32_merge_bound=merge32_bound,
        top1_mismatches_as_one_cast=as_one_cast,
        adapter_effect_max_abs_logit_diff=adapter_effect["max_abs_logit_diff"],
        passed=bool(result["max_abs_logit_diff"] <= bound and merge32["max_abs_logit_diff"] <= merge32_bound
                    and result["top1_mismatches"] == result["top1_mismatches_near_ties"] + as_one_cast),
    )
    if return_reference:
        return result, {"ids": ids, "logits": merged_logits}
    return result


def _top1_changes_as_one_cast(reference: list[np.ndarray], candidate: list[np.ndarray],
                              one_cast: list[np.ndarray]) -> int:
    """Positions where the candidate's top-1 token differs from the reference's outside a near-tie (as
    compare_logits counts them) and is the one-cast model's top-1 token there, which differs from the reference's
    too."""
    count = 0
    for ref, cand, cast in zip(reference, candidate, one_cast):
        n = min(len(ref), len(cand), len(cast))
        top_cand, changed, near_tie = _top1_changes(ref[:n], cand[:n])
        count += int((changed & ~near_tie & (top_cand == cast[:n].argmax(-1))).sum())
    return count


def verify_against_fp8_trained(base_model_dir: Path, adapter_dir: Path, merged: dict, merged_check: dict, *,
                               device: str = "cpu") -> dict:
    """The merged model (merged: its prompt ids and logits, from verify_merged) against the model an FP8-base
    adapter was trained as: the base converted to FP8 as training converted it (lanner.kernels), with the
    adapter, float32 compute (the FP8 products emulated on the CPU, on the tensor cores on an FP8 GPU).
    Bound (docs/fp8.md): 2 x the largest logit gap between the base in 16 bits and in FP8, without the
    adapter, plus check 1's bound for the merge's own rounding."""
    import torch
    from transformers import AutoModelForCausalLM

    from lanner.kernels.quant import quantize_model

    from .merge import load_adapter

    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32, device_map=device,
                                                **base_load_kwargs(base_model_dir))
    base.eval()
    base16 = _logits(base, merged["ids"])
    model = load_adapter(quantize_model(base, quant_type="fp8"), adapter_dir)
    model.eval()
    trained = _logits(model, merged["ids"])
    with model.disable_adapter():
        base8 = _logits(model, merged["ids"])
    del model, base
    gap = compare_logits(base16, base8)["max_abs_logit_diff"]
    result = compare_logits(trained, merged["logits"])
    bound = 2 * gap + merged_check["bound_max_abs_logit_diff"]
    result.update(check="merged (16-bit) vs the FP8-trained model (FP8 base + adapter, float32 compute)",
                  base_fp8_gap_max_abs_logit_diff=gap, bound_max_abs_logit_diff=bound, top1_required=False,
                  passed=bool(result["max_abs_logit_diff"] <= bound))
    return result


def verify_whole_model(model_dir: Path, merged_dir: Path, *, device: str = "cpu") -> tuple[dict, dict]:
    """The 16-bit copy of a whole trained model against the model itself. Returns the JSON-able
    result and the copy's prompt ids and logits (the reference of the GGUF checks)."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = _merged_dtype(merged_dir)
    with contextlib.ExitStack() as files:
        trained, copy = _tensor_handles(model_dir, files), _tensor_handles(merged_dir, files)
        differ = [name for name in copy if name not in trained
                  or not torch.equal(trained[name].get_tensor(name).to(dtype), copy[name].get_tensor(name))]
        missing = sorted(set(trained) - set(copy))
    reference = merged_reference(merged_dir, device=device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, device_map=device)
    result = compare_logits(_logits(model.eval(), reference["ids"]), reference["logits"])
    del model
    result.update(
        check=f"16-bit copy vs the trained model: every tensor the trained one rounded to {dtype}; logits "
              "(float32 compute) vs the trained model's (float32)",
        merged_dtype=str(dtype).replace("torch.", ""), tensors=len(copy), tensors_differing=differ[:10],
        tensors_missing=missing[:10], tensors_differing_count=len(differ), tensors_missing_count=len(missing),
        passed=bool(not differ and not missing and result["top1_mismatches"] == result["top1_mismatches_near_ties"]),
    )
    return result, reference


def _tensor_handles(model_dir: Path, files: contextlib.ExitStack) -> dict:
    """Each tensor name of a checkpoint's safetensors files -> the open file that holds it."""
    from safetensors import safe_open

    handles = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        handle = files.enter_context(safe_open(str(file), framework="pt"))
        handles.update(dict.fromkeys(handle.keys(), handle))
    return handles


def _merged_dtype(merged_dir: Path):
    import json

    import torch

    config = json.loads((Path(merged_dir) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "bfloat16"
    return getattr(torch, str(name).replace("torch.", ""))


def merged_reference(merged_dir: Path, *, device: str = "cpu") -> dict:
    """Prompt ids and float32 logits of the merged model, when verify_merged was not run."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = prompt_ids(AutoTokenizer.from_pretrained(merged_dir))
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, device_map=device)
    return {"ids": ids, "logits": _logits(merged.eval(), ids)}


def _open_gguf(path: Path, n_ctx: int):
    from lanner.inference.generation import open_llama

    return open_llama(path, logits_all=True, n_ctx=n_ctx)


def verify_gguf(gguf_path: Path, reference: dict, *, kl_bound: float | None, require_top1: bool,
                tokenizer_texts: dict[str, list[int]] | None = None, generate_tokens: int = 8) -> dict:
    """Run the fixed prompts through llama.cpp and compare with the merged model's logits."""
    ids_list, ref_logits = reference["ids"], reference["logits"]
    n_ctx = max(64, 2 ** math.ceil(math.log2(max(len(ids) for ids in ids_list) + generate_tokens + 8)))
    try:
        llm = _open_gguf(gguf_path, n_ctx)
    except ValueError as error:  # llama-cpp-python's "Failed to load model from file"
        return {"check": "llama.cpp (llama-cpp-python) loads the file", "loads": False, "load_error": str(error),
                "top1_required": False, "passed": False}
    try:
        got = []
        for ids in ids_list:
            llm.reset()
            llm.eval(ids)
            got.append(np.array(llm.scores[: len(ids)], dtype=np.float32))
        result = compare_logits(ref_logits, got)
        tokenization = {}
        for text, expected in (tokenizer_texts or {}).items():
            tokenization[text] = llm.tokenize(text.encode(), add_bos=False, special=True) == expected
        llm.reset()
        sample = llm.create_completion(TEXT_PROMPTS[0], max_tokens=generate_tokens, temperature=0.0)
        generated = sample["choices"][0]["text"]
    finally:
        llm.close()
    passed = bool(generated.strip()) and all(tokenization.values())
    if kl_bound is not None:
        passed = passed and result["mean_kl"] <= kl_bound
    if require_top1:
        passed = passed and result["top1_mismatches"] == result["top1_mismatches_near_ties"]
    result.update(check="llama.cpp (llama-cpp-python) vs merged model (transformers, float32 compute)",
                  kl_bound=kl_bound, top1_required=require_top1, tokenization_matches=tokenization,
                  generated=generated, passed=passed)
    return result


def tokenizer_texts(merged_dir: Path) -> dict[str, list[int]]:
    """The plain prompts with Hugging Face's ids, to check llama.cpp tokenizes them identically."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    return {text: tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXT_PROMPTS}
