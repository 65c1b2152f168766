"""One export job: adapter, merged model, GGUF files (+ Ollama Modelfiles), verification and a
manifest, built in a temporary directory beside `out_dir` and renamed into place at the end. Each
format is kept when its check passes; one that fails its check is removed and reported in the
manifest's `formats` (with the GGUFs made from a merged model that failed), and the export fails only
when nothing it was asked for is kept, or on an error (disk, cancel, a bad adapter), which leaves
nothing. The free disk is checked for the whole export before anything is written. A job that
trained every weight (model_dir, no adapter) has no adapter to export: its "merged" model is the
trained model saved in 16 bits, and the GGUF files are converted from that.

Layout of out_dir:
    adapter/                      PEFT adapter (adapter_config.json, adapter_model.safetensors, tokenizer)
    merged/                       merged (or whole trained) 16-bit safetensors + tokenizer + chat template
    gguf/<name>-<type>.gguf       one per requested type; <name>-<type>.Modelfile beside each,
    gguf/Modelfile                and Modelfile for the smallest type
    export.json                   the manifest: artifacts (relative paths, bytes, status), each format's
                                  status (`formats`, FormatStatus), what failed and why (`failed`), verification
"""
from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lanner.core.default_model import DEFAULT_MODEL_HUB_ID, DEFAULT_MODEL_ID
from lanner.core.model_paths import hub_commit
from lanner.core.export_spec import (FIGURE_MEANINGS, GGUF_BITS_PER_WEIGHT, GGUF_TYPES, MERGED_DTYPES, QUANTIZER_TYPES,
                                     CheckFigure, ExportSpec, FormatOutcome, FormatStatus, format_advice)

from .adapter import adapter_weights_size, export_adapter
from .dequantize import Quantization
from .files import ExportError, ProgressFn, atomic_dir, ensure_free_space, no_progress, remove_partials, tree_size
from .gguf_convert import convert_to_gguf, expected_gguf_bytes
from .gguf_quantize import expected_quant_bytes, quantize_gguf
from .gguf_tokenizer import read_chat_template
from .merge import expected_merged_bytes, export_merged, export_whole_model
from .modelfile import write_modelfile
from .verify import (F16_KL_BOUND, Q8_0_KL_BOUND, merged_reference, tokenizer_texts, verify_against_fp8_trained,
                     verify_gguf, verify_merged, verify_whole_model)

MANIFEST = "export.json"
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # the hub's "owner/name"
# progress(stage, fraction) is called with these stages, in this order, each from 0.0 to 1.0
# ("gguf-<type>" for f16/bf16/q8_0 from our converter, "quantize-<type>" for llama.cpp's types;
# "merge" is the 16-bit save of a whole trained model too).
STAGES = ("check", "adapter", "merge", "verify-merged", "gguf-<type>", "quantize-<type>", "verify-gguf", "done")
DEFAULT = ExportSpec()


@dataclass
class ExportRequest:
    base_model_dir: Path           # the 16/32-bit base checkpoint the job trained from
    adapter_dir: Path | None       # the trainer's PEFT adapter; None for a whole trained model (model_dir)
    out_dir: Path                  # e.g. LANNER_DATA_DIR/artifacts/<job>/export
    base_model_name: str | None = None   # the job's model: hub id, local path or DEFAULT_MODEL_ID (see loadable_base_name)
    name: str = "model"            # file stem of the GGUFs
    adapter: bool = DEFAULT.adapter
    merged: bool = DEFAULT.merged
    merged_dtype: str = DEFAULT.merged_dtype
    gguf_types: tuple[str, ...] = tuple(DEFAULT.gguf_types)
    verify: bool = DEFAULT.verify
    device: str = "cpu"
    reserve_bytes: int = 0         # keep this much disk free after the export
    # A QLoRA adapter: how training quantised the base (dequantize.Quantization's fields; {} for the
    # defaults). The adapter is merged into that base, dequantised. None for a LoRA adapter.
    base_quantization: dict | None = None
    model_dir: Path | None = None  # a job that trained every weight (full, pretrain): its saved model
    fp8_base: bool = False         # the adapter was trained over an FP8 base (lora_fp8): also checked against it
    extra: dict = field(default_factory=dict)


def validate(request: ExportRequest) -> None:
    if request.merged_dtype not in MERGED_DTYPES:
        raise ExportError(f"merged_dtype must be one of {MERGED_DTYPES}")
    unknown = [t for t in request.gguf_types if t not in GGUF_TYPES]
    if unknown:
        raise ExportError(f"Unknown GGUF types {unknown}; known: {', '.join(GGUF_TYPES)}")
    if not (request.adapter or request.merged or request.gguf_types):
        raise ExportError("Nothing to export: choose the adapter, the merged model or a GGUF type.")
    if (request.adapter_dir is None) == (request.model_dir is None):
        raise ExportError("An export reads either a trained adapter or a whole trained model, not both nor neither.")
    if request.adapter and request.adapter_dir is None:
        raise ExportError("The job trained every weight, so it has no LoRA adapter to export; "
                          "export the merged 16-bit model or GGUF files instead.")
    if request.model_dir is not None and request.base_quantization is not None:
        raise ExportError("A whole trained model has no 4-bit base to merge into.")
    _quantization(request)


def _quantization(request: ExportRequest) -> Quantization | None:
    return None if request.base_quantization is None else Quantization.from_config(request.base_quantization)


def loadable_base_name(request: ExportRequest) -> str:
    """The base as loaders outside Lanner find it (adapter_config.json's base_model_name_or_path): the
    built-in model's hub id; a hub id as the job named it ("org/name", even when the studio downloaded
    it into its models folder); else the local checkpoint's absolute path."""
    name = request.base_model_name
    if name == DEFAULT_MODEL_ID:
        return DEFAULT_MODEL_HUB_ID
    if name and HUB_ID.match(name) and not Path(name).expanduser().is_absolute():
        return name
    if Path(request.base_model_dir).is_dir():
        return str(Path(request.base_model_dir).resolve())
    return name or str(request.base_model_dir)


def expected_bytes(request: ExportRequest) -> dict[str, int]:
    """Sizes the export will write, by part (the intermediate merged model and f16 GGUF included)."""
    sizes = {}
    if request.adapter:
        sizes["adapter"] = adapter_weights_size(request.adapter_dir)
    source = request.model_dir or request.base_model_dir  # what the merged model has the tensors of
    if request.merged or request.gguf_types:
        sizes["merged"] = expected_merged_bytes(source)
    if request.gguf_types:
        # The converter's estimate reads the merged checkpoint, which does not exist yet: same tensors.
        f16 = expected_gguf_bytes(source, "f16")
        sizes["gguf-f16"] = f16
        for qtype in request.gguf_types:
            if qtype == "bf16":
                sizes["gguf-bf16"] = f16
            elif qtype == "q8_0":
                sizes["gguf-q8_0"] = int(f16 * GGUF_BITS_PER_WEIGHT["q8_0"] / 16) + (4 << 20)
            elif qtype != "f16":
                sizes[f"gguf-{qtype}"] = expected_quant_bytes(f16, qtype)
    return sizes


def run_export(request: ExportRequest, progress: ProgressFn = no_progress) -> dict:
    """Make every artifact the request asks for, verify them, and return the manifest (also written
    to out_dir/export.json). A format that fails its check is left out and reported (manifest
    `formats` and `failed`); raises ExportError when nothing asked for is kept (NotEnoughDiskSpace
    for a short disk), and then, as on any error, nothing of this export is left on disk."""
    started = time.monotonic()
    validate(request)
    out_dir = Path(request.out_dir)
    base_name = loadable_base_name(request)
    progress("check", 0.0)
    remove_partials(out_dir)  # left by an earlier attempt that was killed
    sizes = expected_bytes(request)
    free = ensure_free_space(out_dir.parent, sum(sizes.values()), reserve_bytes=request.reserve_bytes)
    progress("check", 1.0)

    manifest: dict = {"base_model": base_name, "expected_bytes": sizes, "free_bytes_at_start": free,
                      "request": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(request).items()},
                      "artifacts": [], "formats": {}, "failed": {}, "verification": {}}
    made = FormatStatus.verified if request.verify else FormatStatus.unchecked
    with atomic_dir(out_dir) as work:
        adapter_dir = request.adapter_dir
        if request.adapter:
            info = export_adapter(request.adapter_dir, work / "adapter", base_model=base_name,
                                  revision=hub_commit(request.base_model_dir, base_name),
                                  progress=progress, check_space=False,
                                  built_in_copy=request.base_model_name == DEFAULT_MODEL_ID,
                                  base_model_dir=request.base_model_dir)
            adapter_dir = work / "adapter"  # verify what we ship
            _keep(manifest, "adapter", _relative(info, work, kind="adapter"), FormatStatus.unchecked)

        if request.merged or request.gguf_types:
            if request.model_dir is None:
                info = export_merged(request.base_model_dir, adapter_dir, work / "merged", dtype=request.merged_dtype,
                                     device=request.device, quantization=_quantization(request), progress=progress,
                                     check_space=False)
            else:
                info = export_whole_model(request.model_dir, work / "merged", base_model_dir=request.base_model_dir,
                                          dtype=request.merged_dtype, device=request.device, progress=progress,
                                          check_space=False)
            merged_passed, reference = True, None
            if request.verify:
                progress("verify-merged", 0.0)
                if request.model_dir is None:
                    result, reference = verify_merged(request.base_model_dir, adapter_dir, work / "merged",
                                                      device=request.device, quantization=_quantization(request),
                                                      return_reference=True)
                else:
                    result, reference = verify_whole_model(request.model_dir, work / "merged", device=request.device)
                manifest["verification"]["merged"] = result
                if request.fp8_base and request.model_dir is None:
                    manifest["verification"]["fp8_trained"] = verify_against_fp8_trained(
                        request.base_model_dir, adapter_dir, reference, result, device=request.device)
                progress("verify-merged", 1.0)
                merged_passed = result["passed"]
            if not merged_passed:
                trained = "adapter" if request.model_dir is None else "model"
                figures = check_figures(result)
                reason = f"The merged model does not match the trained {trained}: {_misses(figures)}"
                if request.merged:
                    _drop(manifest, "merged", FormatStatus.failed, reason, figures, request)
                for qtype in request.gguf_types:
                    _drop(manifest, f"gguf-{qtype}", FormatStatus.not_made,
                          f"Not made: GGUF files are converted from the merged model. {reason}", [], request)
            else:
                if request.merged:
                    _keep(manifest, "merged", _relative(info, work, kind="merged"), made,
                          check_figures(result) if request.verify else [])
                if request.gguf_types:
                    _export_gguf(request, work, manifest, reference, progress)
            if not request.merged or not merged_passed:
                shutil.rmtree(work / "merged")
        if manifest["failed"] and not manifest["artifacts"]:
            raise ExportError("Nothing of this export passed its check: " + "; ".join(manifest["failed"].values()),
                              formats=manifest["formats"], verification=manifest["verification"])
        manifest["seconds"] = round(time.monotonic() - started, 1)
        manifest["bytes"] = tree_size(work)
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    progress("done", 1.0)
    manifest["path"] = str(out_dir)
    return manifest


def _keep(manifest: dict, format_name: str, artifact: dict, status: FormatStatus,
          figures: Sequence[CheckFigure] = ()) -> None:
    artifact["status"] = status.value
    manifest["artifacts"].append(artifact)
    manifest["formats"][format_name] = FormatOutcome(status=status, figures=list(figures)).model_dump(mode="json")


def _drop(manifest: dict, format_name: str, status: FormatStatus, reason: str, figures: list[CheckFigure],
          request: ExportRequest) -> None:
    advice = format_advice(format_name, status, request.merged_dtype, has_adapter=request.model_dir is None)
    manifest["formats"][format_name] = FormatOutcome(status=status, reason=reason, figures=figures,
                                                     advice=advice).model_dump(mode="json")
    manifest["failed"][format_name] = reason


def check_figures(check: dict) -> list[CheckFigure]:
    """The figures a check (verify.py's result) is judged by, each against its bound: a check failed
    exactly when one of them missed."""
    figures = []

    def add(key: str, measured: float, bound: float, within: str = "at most") -> None:
        name, meaning = FIGURE_MEANINGS[key]
        passed = measured <= bound if within == "at most" else measured >= bound
        figures.append(CheckFigure(figure=name, measured=measured, bound=bound, within=within, passed=passed,
                                   meaning=meaning))

    if "loads" in check:  # a file llama.cpp could not load has no other figure
        add("loads", int(check["loads"]), 1, "at least")
    if check.get("bound_max_abs_logit_diff") is not None:
        add("max_abs_logit_diff", check["max_abs_logit_diff"], check["bound_max_abs_logit_diff"])
    if check.get("float32_merge_bound") is not None:
        add("float32_merge_max_abs_logit_diff", check["float32_merge_max_abs_logit_diff"], check["float32_merge_bound"])
    if "tensors_differing_count" in check:
        add("tensors_differing", check["tensors_differing_count"] + check["tensors_missing_count"], 0)
    if check.get("top1_required", True):
        add("top1_mismatches", check["top1_mismatches"] - check["top1_mismatches_near_ties"]
            - check.get("top1_mismatches_as_one_cast", 0), 0)
    if check.get("kl_bound") is not None:
        add("mean_kl", check["mean_kl"], check["kl_bound"])
    if "tokenization_matches" in check:
        add("tokenization_mismatches", sum(not same for same in check["tokenization_matches"].values()), 0)
    if "generated" in check:
        add("generated_characters", len(check["generated"].strip()), 1, "at least")
    return figures


def _misses(figures: list[CheckFigure]) -> str:
    """The figures that missed their bound, in words (the whole check stays in the manifest)."""
    return "; ".join(f"{f.figure} {f.measured:.4g}, {'above' if f.within == 'at most' else 'below'} its bound "
                     f"{f.bound:.4g}" for f in figures if not f.passed)


def _relative(info: dict, work: Path, *, kind: str) -> dict:
    info = dict(info)
    info["kind"] = kind
    info["path"] = str(Path(info["path"]).relative_to(work))
    return info


def _export_gguf(request: ExportRequest, work: Path, manifest: dict, reference: dict | None,
                 progress: ProgressFn) -> None:
    merged_dir = work / "merged"
    gguf_dir = work / "gguf"
    gguf_dir.mkdir()
    f16_path = gguf_dir / f"{request.name}-f16.gguf"
    paths: dict[str, Path] = {}
    paths["f16"] = f16_path
    infos = {"f16": convert_to_gguf(merged_dir, f16_path, out_type="f16", name=request.name,
                                    progress=progress, check_space=False)}
    for qtype in request.gguf_types:
        path = gguf_dir / f"{request.name}-{qtype}.gguf"
        if qtype in QUANTIZER_TYPES:  # llama.cpp's quantizer, from the one f16 conversion
            infos[qtype] = quantize_gguf(f16_path, path, qtype, progress=progress, check_space=False)
        elif qtype != "f16":          # written by our converter, from the merged weights
            infos[qtype] = convert_to_gguf(merged_dir, path, out_type=qtype, name=request.name,
                                           progress=progress, check_space=False)
        paths[qtype] = path

    checks = {}
    if request.verify:
        if reference is None:
            reference = merged_reference(merged_dir, device=request.device)
        texts = tokenizer_texts(merged_dir)
        for i, (qtype, path) in enumerate(paths.items()):
            progress("verify-gguf", i / len(paths))
            kl_bound = {"f16": F16_KL_BOUND, "bf16": F16_KL_BOUND, "q8_0": Q8_0_KL_BOUND}.get(qtype)
            checks[qtype] = verify_gguf(path, reference, kl_bound=kl_bound, require_top1=qtype in ("f16", "bf16"),
                                        tokenizer_texts=texts)
        manifest["verification"]["gguf"] = checks
        progress("verify-gguf", 1.0)

    for qtype in list(paths):
        failed = qtype in request.gguf_types and not checks.get(qtype, {"passed": True})["passed"]
        if failed:
            figures = check_figures(checks[qtype])
            _drop(manifest, f"gguf-{qtype}", FormatStatus.failed,
                  f"The GGUF {qtype} does not run like the merged model in llama.cpp: {_misses(figures)}", figures,
                  request)
        if failed or qtype not in request.gguf_types:
            paths.pop(qtype).unlink()
    if not paths:
        gguf_dir.rmdir()
        return
    chat_template = read_chat_template(merged_dir, json.loads((merged_dir / "tokenizer_config.json").read_text()))
    stops = _stop_tokens(merged_dir)
    made = FormatStatus.verified if request.verify else FormatStatus.unchecked
    for qtype, path in paths.items():
        info = _relative(infos[qtype], work, kind="gguf")
        info["verification"] = checks.get(qtype, {}).get("passed")
        _keep(manifest, f"gguf-{qtype}", info, made, check_figures(checks[qtype]) if qtype in checks else [])
        modelfile = write_modelfile(path, chat_template, stops, path.with_suffix(".Modelfile"))
        manifest["artifacts"].append(_relative(modelfile, work, kind="modelfile"))
    smallest = min(paths.values(), key=lambda p: p.stat().st_size)
    manifest["artifacts"].append(_relative(write_modelfile(smallest, chat_template, stops), work, kind="modelfile"))


def _stop_tokens(merged_dir: Path) -> list[str]:
    config = json.loads((merged_dir / "tokenizer_config.json").read_text())
    eos = config.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return [eos] if eos else []
