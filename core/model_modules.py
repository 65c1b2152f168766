"""The layers of a local checkpoint that LoRA can adapt, read from its weight names and shapes (the safetensors
headers, or an index's weight map) without loading a tensor or importing torch, so that the API refuses a job's
`lora.target_modules` that name none of them when it is queued instead of when the worker builds the adapter
(backend/services/jobs.py).

A module is a weight's name less its last part (`model.layers.0.self_attn.q_proj.weight`); PEFT's LoRA adapts the
modules with a weight of 2 dimensions or more (linear, embedding, convolution layers), not a norm (1-D weight). A
mixture of experts stacked in the checkpoint (`mlp.experts.gate_up_proj`, gpt-oss) names its stacked weights
(PEFT target_parameters); one stored per expert (`mlp.experts.3.gate_proj.weight`, Mixtral's `experts.3.w1`,
Qwen3-MoE) names each expert's projections. A target names a layer as PEFT matches a list of names: the full name,
or its last parts after a dot."""
from __future__ import annotations

import json
import re
import struct
from functools import lru_cache
from pathlib import Path

from lanner.core.default_model import DEFAULT_MODEL_ID, builtin_dir, is_imported
from lanner.core.model_paths import allowed_model_folder
from lanner.core.settings import Settings
from lanner.core.spec import LORA_TARGET_CHOICES

# The files that name a checkpoint's weights: one safetensors file, a shard index (with its shards' headers for the
# shapes), a .bin index (names alone). A lone pytorch_model.bin is a pickle, which only torch reads: not checked.
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
# A header this long is not read (the format allows 100 MB; a real shard's is kilobytes, ~150 bytes a tensor):
# such a checkpoint is not checked, and the parsed headers the API caches stay small.
MAX_HEADER_BYTES = 16 * 2**20
# The studio's names for a causal LM's layers (the projections of LORA_TARGET_CHOICES, the embeddings, the head),
# taken whatever the checkpoint holds: a tied head has no weight of its own, the worker maps the MLP names onto a
# mixture's experts (and Phi-3's fused projections), and transformers renames some checkpoints' layers to them on
# load (EXAONE's c_fc_0 becomes gate_proj, GPT-NeoX's embed_out lm_head), which the API cannot tell without it.
STUDIO_NAMES = (*LORA_TARGET_CHOICES["attention"], *LORA_TARGET_CHOICES["experts"], "embed_tokens", "lm_head")
# gpt-oss's MXFP4 experts are stored as the stacked weight's blocks and scales.
_MXFP4_PARTS = re.compile(r"_(blocks|scales)$")
LISTED = 16  # the layers a refusal names, at most


def checkpoint_folder(model: str, settings: Settings) -> Path | None:
    """The folder of the model's checkpoint on this machine, as the worker finds it (the built-in model once
    imported, a local folder an admin allows, a hub model downloaded into DATA_DIR/models); None elsewhere."""
    if model == DEFAULT_MODEL_ID:
        return builtin_dir(settings.models_dir) if is_imported(settings.models_dir) else None
    folder = allowed_model_folder(model, settings)
    try:
        return folder if folder is not None and folder.is_dir() else None
    except OSError:  # a name too long for the file system
        return None


@lru_cache(maxsize=64)
def _header(path: str, stamp: tuple[int, int]) -> dict[str, tuple[int, ...]]:
    """A safetensors file's weights by name with their shapes (its first 8 bytes give the JSON header's length);
    stamp, the file's modification time and size, keeps the cache true to the file."""
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        if length > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: a safetensors header of {length} bytes")
        header = json.loads(file.read(length))
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    stat = path.stat()
    return _header(str(path), (stat.st_mtime_ns, stat.st_size))


def _weight_map(index: Path) -> dict[str, str]:
    return json.loads(index.read_text())["weight_map"]


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...] | None] | None:
    """The checkpoint's weights by name, with their shapes where a safetensors header gives them (None from a .bin
    index, or a shard that is missing); None when the folder holds no checkpoint read this way, or a broken one."""
    try:
        if (folder / SAFETENSORS).is_file():
            return dict(_shapes(folder / SAFETENSORS))
        if (folder / SAFETENSORS_INDEX).is_file():
            weight_map = _weight_map(folder / SAFETENSORS_INDEX)
            shards = {shard: _shapes(folder / shard) for shard in set(weight_map.values())
                      if Path(shard).name == shard and (folder / shard).is_file()}  # the folder's own files only
            return {name: shards.get(shard, {}).get(name) for name, shard in weight_map.items()}
        if (folder / BIN_INDEX).is_file():
            return dict.fromkeys(_weight_map(folder / BIN_INDEX))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
        return None  # not a checkpoint to judge: the worker says what is wrong with it
    return None


def adaptable_layers(shapes: dict[str, tuple[int, ...] | None]) -> set[str]:
    """The full names of the layers LoRA can adapt: each module with a weight of 2 dimensions or more (or of a shape
    not known), and each stacked weight of a mixture's experts (3 dimensions or more, as `mlp.experts.down_proj`)."""
    layers = set()
    for name, shape in shapes.items():
        module, _, last = name.rpartition(".")
        dims = 3 if shape is None else len(shape)
        if last in ("weight", "qweight") and module and dims >= 2:  # qweight: a GPTQ or AWQ checkpoint's
            layers.add(module)
        elif module.rpartition(".")[2] == "experts" and dims >= 3:
            layers.add(f"{module}.{_MXFP4_PARTS.sub('', last)}")
    return layers


def names_a_layer(target: str, layers: set[str]) -> bool:
    """PEFT's rule for a list of target names: a layer's full name, or its last parts after a dot."""
    return any(layer == target or layer.endswith(f".{target}") for layer in layers)


def _listing(layers: set[str]) -> str:
    short = {layer.rpartition(".")[2] for layer in layers} | {"lm_head"}
    ordered = [name for name in STUDIO_NAMES if name in short] + sorted(short - set(STUDIO_NAMES))
    more = f" and {len(ordered) - LISTED} more" if len(ordered) > LISTED else ""
    return ", ".join(ordered[:LISTED]) + more


def target_modules_problem(model: str, target_modules: list[str], settings: Settings) -> str | None:
    """Why target_modules name a layer the model's local checkpoint lacks or LoRA cannot adapt, in words; None when
    each names one, or when the checkpoint is not on this machine (a hub model not downloaded: not checked)."""
    folder = checkpoint_folder(model, settings)
    shapes = weight_shapes(folder) if folder is not None else None
    if not shapes:
        return None
    layers = adaptable_layers(shapes)
    unknown = [target for target in dict.fromkeys(target_modules)
               if target not in STUDIO_NAMES and not names_a_layer(target, layers)]
    if not unknown:
        return None
    modules = {name.rpartition(".")[0] for name in shapes}
    not_adaptable = [target for target in unknown if names_a_layer(target, modules)]
    why = (f" ({', '.join(not_adaptable)} {'names' if len(not_adaptable) == 1 else 'name'} only layers with no 2-D "
           "weight, such as norms)") if not_adaptable else ""
    label = model.rstrip("/").rpartition("/")[2]
    return (f"lora.target_modules: {', '.join(map(repr, unknown))} {'names' if len(unknown) == 1 else 'name'} no "
            f"layer of {label} that LoRA can adapt{why}; its linear and embedding layers are {_listing(layers)} "
            "(or all-linear)")
