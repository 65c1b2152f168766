"""Our Hugging Face -> GGUF converter, written on the gguf package's GGUFWriter (no llama.cpp script).

It streams: tensor infos are planned from the safetensors headers, then each tensor is read,
transformed (q/k permutation for llama.cpp's LLAMA rope), converted to the output type and written,
one at a time, so memory stays at about one tensor (a mixture of experts: one layer's experts of one
projection, stacked into the single 3D tensor llama.cpp reads). Output types: f16, bf16, q8_0 (numpy, from the
gguf package's quants module). Norms and biases stay f32, as llama.cpp's converter keeps them.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import quants

from .files import ExportError, ProgressFn, atomic_file, ensure_free_space, no_progress
from .gguf_arch import (ArchSpec, arch_for, context_length, expert_count, llama3_rope_factors, model_shape,
                        permute_for_llama_rope, rope_settings, yarn_attn_factor, yarn_rope_divisors)
from .gguf_tokenizer import read_tokenizer, write_tokenizer

OUT_TYPES = {
    "f16": (QT.F16, gguf.LlamaFileType.MOSTLY_F16),
    "bf16": (QT.BF16, gguf.LlamaFileType.MOSTLY_BF16),
    "q8_0": (QT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
}


@dataclass
class PlannedTensor:
    hf_name: str
    file: Path
    gguf_name: str
    shape: tuple[int, ...]
    qtype: QT
    permute_heads: int | None
    add: float = 0.0                # added to every value (Gemma's norm offset)
    scale: float = 1.0              # then multiplied (a folded query scale)
    data: np.ndarray | None = None  # a tensor the converter makes (not read from the checkpoint)
    # Experts saved one tensor each: (hf_name, file) per expert, in expert order, stacked on a new first axis.
    experts: tuple[tuple[str, Path], ...] = ()
    transpose: bool = False  # the last two axes swapped (experts saved [experts, in, out])
    part: tuple[int, slice] | None = None  # (axis, slice) taken after that: gate or up of a stacked gate_up_proj


# One expert's projection as save_pretrained writes it (Qwen: mlp.experts.3.gate_proj; Mixtral:
# block_sparse_moe.experts.3.w1), and transformers 5's stacked in-memory weights, should a checkpoint hold them
# (gpt-oss's checkpoints do, with their biases: experts.gate_up_proj_bias, experts.down_proj_bias).
EXPERT_TENSOR = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")
STACKED_GATE_UP = ".experts.gate_up_proj"
STACKED_DOWN = ".experts.down_proj"
BIAS = "_bias"


def _tensor_type(gguf_name: str, shape: tuple[int, ...], wanted: QT) -> QT:
    if len(shape) < 2 or gguf_name.endswith(("ffn_gate_inp.weight", ".bias")):
        return QT.F32  # norms, biases and the router stay float32, as llama.cpp's converter keeps them
    if wanted == QT.Q8_0 and shape[-1] % 32:
        return QT.F16  # Q8_0 needs rows in blocks of 32
    return wanted


def _nbytes(shape: tuple[int, ...], qtype: QT) -> int:
    if qtype == QT.F32:
        return int(np.prod(shape)) * 4
    if qtype == QT.F16:
        return int(np.prod(shape)) * 2
    return int(np.prod(quants.quant_shape_to_byte_shape(shape, qtype)))


def _swap_last_two(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A PlannedTensor's shape once `transpose` has swapped the checkpoint's last two axes."""
    return (*shape[:-2], shape[-1], shape[-2])


def _sort_key(name: str):
    match = re.match(r"blk\.(\d+)\.", name)
    if name.startswith("token_embd"):
        return (-1, name)
    return (int(match.group(1)), name) if match else (10**9, name)


def plan_tensors(model_dir: Path, config: dict, spec: ArchSpec, out_type: QT) -> list[PlannedTensor]:
    from safetensors import safe_open

    shape_info = model_shape(config)
    name_map = gguf.get_tensor_name_map(spec.arch, shape_info.n_layers)
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[spec.arch]}
    tied = bool(config.get("tie_word_embeddings"))
    query_scale = spec.query_scale(config) if spec.query_scale else 1.0
    planned = []

    def plan(hf_name: str, file: Path, shape: tuple[int, ...], mapped_as: str | None = None, **source) -> None:
        """One GGUF tensor from hf_name (named as mapped_as when that differs: a stack or a slice of it)."""
        gguf_name = name_map.get_name(mapped_as or hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ExportError(f"No GGUF name for tensor {hf_name!r} of a {spec.name} model.")
        base = gguf_name.rsplit(".", 1)[0]
        generic = re.sub(r"^blk\.\d+\.", "blk.{bid}.", base)
        if generic not in allowed:
            raise ExportError(f"Tensor {gguf_name} is not part of llama.cpp's {spec.name} graph.")
        if gguf_name.endswith(".bias") and generic.removeprefix("blk.{bid}.") not in spec.biases:
            raise ExportError(f"The checkpoint has a bias on {hf_name.removesuffix('.bias')} (the config's "
                              f"attention_bias / mlp_bias); llama.cpp's {spec.name} graph has no bias there and "
                              "would refuse the file.")
        heads = None
        if spec.permute_qk and base.endswith(".attn_q"):
            heads = shape_info.n_head
        elif spec.permute_qk and base.endswith(".attn_k"):
            heads = shape_info.n_head_kv
        add = spec.norm_offset if gguf_name.endswith("norm.weight") else 0.0
        scale = query_scale if base.endswith("." + spec.query_scale_tensor) else 1.0
        planned.append(PlannedTensor(hf_name, file, gguf_name, shape, _tensor_type(gguf_name, shape, out_type),
                                     heads, add=add, scale=scale, **source))

    def plan_gate_up(hf_name: str, file: Path, shape: tuple[int, ...]) -> None:
        """A stacked gate_up_proj as two GGUF tensors, gate and up: saved [experts, 2 x intermediate, hidden]
        with gate rows first; or (experts_in_out_interleaved) [experts, hidden, 2 x intermediate], transposed,
        with gate and up in alternate rows, and the same for its bias [experts, 2 x intermediate]."""
        bias = hf_name.endswith(BIAS)
        prefix = hf_name.removesuffix(BIAS)[: -len("gate_up_proj")]
        suffix = ".bias" if bias else ".weight"
        transpose = spec.experts_in_out_interleaved and not bias
        shape = _swap_last_two(shape) if transpose else shape
        axis = -1 if bias else -2
        rows = shape[axis]
        half = (*shape[:axis], rows // 2, *shape[axis:][1:])
        if spec.experts_in_out_interleaved:
            gate, up = slice(0, rows, 2), slice(1, rows, 2)
        else:
            gate, up = slice(0, rows // 2), slice(rows // 2, rows)
        plan(hf_name, file, half, prefix + "gate_proj" + suffix, transpose=transpose, part=(axis, gate))
        plan(hf_name, file, half, prefix + "up_proj" + suffix, transpose=transpose, part=(axis, up))

    experts: dict[tuple[str, str], dict[int, tuple[str, Path, tuple[int, ...]]]] = {}
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ExportError(f"{model_dir} has no safetensors weights")
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for hf_name in handle.keys():
                if hf_name.endswith(spec.skip_suffixes):
                    continue
                if tied and hf_name == "lm_head.weight":
                    continue  # llama.cpp reuses token_embd when output.weight is absent
                shape = tuple(handle.get_slice(hf_name).get_shape())
                if tied and spec.output_required and hf_name.endswith("embed_tokens.weight"):
                    plan(hf_name, file, shape, "lm_head.weight")  # the graph reads output.weight: a copy
                expert = EXPERT_TENSOR.match(hf_name)
                if expert:
                    group = experts.setdefault((expert["prefix"], expert["proj"]), {})
                    group[int(expert["expert"])] = (hf_name, file, shape)
                elif hf_name.endswith((STACKED_GATE_UP, STACKED_GATE_UP + BIAS)):
                    plan_gate_up(hf_name, file, shape)
                elif hf_name.endswith(STACKED_DOWN):  # [experts, hidden, intermediate] ([.., in, out]: transposed)
                    transpose = spec.experts_in_out_interleaved
                    plan(hf_name, file, _swap_last_two(shape) if transpose else shape, hf_name + ".weight",
                         transpose=transpose)
                elif hf_name.endswith(STACKED_DOWN + BIAS):  # [experts, hidden]
                    plan(hf_name, file, shape, hf_name.removesuffix(BIAS) + ".bias")
                else:  # a bare parameter (gpt-oss's self_attn.sinks) is a .weight to llama.cpp
                    plan(hf_name, file, shape, None if hf_name.endswith((".weight", ".bias")) else hf_name + ".weight")
    for (prefix, proj), group in experts.items():
        if sorted(group) != list(range(expert_count(config))):
            raise ExportError(f"{prefix}.*.{proj} holds experts {sorted(group)}, not all "
                              f"{expert_count(config)} of the config.")
        parts = tuple((group[i][0], group[i][1]) for i in sorted(group))
        plan(parts[0][0], parts[0][1], (len(parts), *group[0][2]), f"{prefix}.{proj}.weight", experts=parts)
    rope = rope_settings(config)
    factors = None
    if rope["type"] == "llama3":
        if not spec.reads_rope_freqs:
            raise ExportError(f"llama3 RoPE scaling on a {spec.name} model is not supported")
        factors = llama3_rope_factors(rope, shape_info.head_dim)
    elif rope["type"] == "yarn" and spec.reads_rope_freqs:  # (what cannot be written is refused by arch_for)
        factors = yarn_rope_divisors(rope, shape_info.head_dim)
    if factors is not None:
        planned.append(PlannedTensor("", Path(), gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight",
                                     factors.shape, QT.F32, None, data=factors))
    planned.sort(key=lambda t: _sort_key(t.gguf_name))
    return planned


def _read(t: PlannedTensor, handle) -> np.ndarray:
    """The tensor's float32 values from the checkpoint (handle(file) is the open safetensors file)."""
    if t.experts:
        return np.stack([handle(file).get_tensor(name).float().numpy() for name, file in t.experts])
    data = handle(t.file).get_tensor(t.hf_name).float().numpy()
    if t.transpose:
        data = data.swapaxes(-1, -2)
    if t.part is not None:
        axis, part = t.part
        data = data[(slice(None),) * (axis % data.ndim) + (part,)]
    return np.ascontiguousarray(data)


def expected_gguf_bytes(model_dir: Path, out_type: str = "f16") -> int:
    config = json.loads((Path(model_dir) / "config.json").read_text())
    planned = plan_tensors(model_dir, config, arch_for(config), OUT_TYPES[out_type][0])
    return sum(_nbytes(t.shape, t.qtype) for t in planned) + (4 << 20)  # + header and vocab


def _convert(data: np.ndarray, qtype: QT) -> np.ndarray:
    if qtype == QT.F32:
        return data.astype(np.float32)
    if qtype == QT.F16:
        return data.astype(np.float16)
    return quants.quantize(data, qtype).view(np.uint8)


def _write_metadata(writer: gguf.GGUFWriter, config: dict, spec: ArchSpec, file_type: int,
                    name: str, vocab_size: int) -> None:
    shape = model_shape(config)
    writer.add_name(name)
    for method, key in spec.hparams:
        if key == "max_position_embeddings":
            getattr(writer, method)(context_length(spec, config))
            continue
        if config.get(key) is None:
            if key == "num_key_value_heads":
                continue
            raise ExportError(f"config.json lacks {key}, needed for the GGUF metadata")
        getattr(writer, method)(config[key])
    writer.add_vocab_size(vocab_size)
    writer.add_rope_dimension_count(shape.head_dim)
    if spec.always_head_dim or shape.head_dim * shape.n_head != shape.hidden:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    rope = rope_settings(config)
    writer.add_rope_freq_base(rope["theta"])
    if rope["theta_local"] is not None:
        writer.add_rope_freq_base_swa(rope["theta_local"])
    if rope["type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif rope["type"] == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(rope["factor"]))
        writer.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
        # llama.cpp multiplies cos/sin by rope.scaling.attn_factor x (1 + 0.1 ln factor), Hugging Face by its
        # attention_factor (by default that same 1 + 0.1 ln factor; or set, or from mscale / mscale_all_dim).
        attn_factor = yarn_attn_factor(rope)
        if not math.isclose(attn_factor, 1.0, rel_tol=1e-7):
            writer.add_rope_scaling_attn_factors(attn_factor)
    if spec.extra_metadata:
        spec.extra_metadata(writer, config)
    writer.add_file_type(int(file_type))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def convert_to_gguf(model_dir: Path, out_path: Path, *, out_type: str = "f16", name: str | None = None,
                    progress: ProgressFn = no_progress, check_space: bool = True) -> dict:
    """Convert a Hugging Face checkpoint (safetensors + tokenizer.json) into one GGUF file.

    out_type: "f16", "bf16" or "q8_0". Written to a temporary name beside out_path and renamed
    at the end; nothing is left behind on failure."""
    model_dir, out_path = Path(model_dir), Path(out_path)
    if out_type not in OUT_TYPES:
        raise ExportError(f"GGUF type {out_type!r} is written by quantize_gguf, not the converter "
                          f"(the converter writes {', '.join(OUT_TYPES)})")
    qtype, file_type = OUT_TYPES[out_type]
    config = json.loads((model_dir / "config.json").read_text())
    spec = arch_for(config)
    planned = plan_tensors(model_dir, config, spec, qtype)
    total = sum(_nbytes(t.shape, t.qtype) for t in planned)
    if check_space:
        ensure_free_space(out_path.parent, total)
    vocab_size = config.get("vocab_size") or next(t.shape[0] for t in planned if t.gguf_name == "token_embd.weight")
    tokenizer = read_tokenizer(model_dir, vocab_size)

    from safetensors import safe_open

    progress(f"gguf-{out_type}", 0.0)
    with atomic_file(out_path) as temp:
        writer = gguf.GGUFWriter(path=None, arch=spec.name)
        try:
            _write_metadata(writer, config, spec, file_type, name or model_dir.name, len(tokenizer.tokens))
            write_tokenizer(writer, tokenizer)
            for t in planned:
                nbytes = _nbytes(t.shape, t.qtype)
                if t.qtype in (QT.F32, QT.F16):
                    writer.add_tensor_info(t.gguf_name, t.shape, np.dtype(np.float32 if t.qtype == QT.F32 else np.float16), nbytes)
                else:
                    writer.add_tensor_info(t.gguf_name, quants.quant_shape_to_byte_shape(t.shape, t.qtype),
                                           np.dtype(np.uint8), nbytes, raw_dtype=t.qtype)
            writer.write_header_to_file(path=temp)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            handles: dict[Path, object] = {}

            def handle(file: Path):
                if file not in handles:
                    handles[file] = safe_open(str(file), framework="pt")
                return handles[file]

            written = 0
            for t in planned:
                if t.data is not None:
                    writer.write_tensor_data(t.data)
                    continue
                data = _read(t, handle)
                if t.permute_heads:
                    data = permute_for_llama_rope(data, t.permute_heads)
                if t.add:
                    data = data + np.float32(t.add)
                if t.scale != 1.0:
                    data = data * np.float32(t.scale)
                writer.write_tensor_data(_convert(data, t.qtype))
                written += _nbytes(t.shape, t.qtype)
                progress(f"gguf-{out_type}", written / total)
            writer.flush()
        finally:
            writer.close()
    return {"format": "gguf", "type": out_type, "path": str(out_path), "bytes": out_path.stat().st_size,
            "architecture": spec.name, "tensors": len(planned), "tokenizer": tokenizer.model,
            "tokenizer_pre": tokenizer.pre, "tokenizer_scores_from": tokenizer.scores_from,
            "chat_template": bool(tokenizer.chat_template)}
