"""k-quants and the other llama.cpp types, made from one f16 GGUF by llama-cpp-python's
`llama_model_quantize` (llama.cpp's own quantizer, linked in the wheel; nothing is cloned or built)."""
from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from pathlib import Path

from lanner.core.export_spec import GGUF_BITS_PER_WEIGHT, GGUF_TYPES

from .files import ExportError, ProgressFn, atomic_file, ensure_free_space, no_progress

# llama.cpp's quantizer makes every GGUF type below 16 bits (q8_0 too, though the export writes it
# with Lanner's converter); f16 and bf16 come from the converter only.
QUANT_TYPES = tuple(qtype for qtype in GGUF_TYPES if qtype not in ("f16", "bf16"))


@contextlib.contextmanager
def _quiet_llama_cpp():
    """llama.cpp logs a line per tensor while quantising; keep only its errors (llama-cpp-python's
    log callback prints what its "llama-cpp-python" logger's level lets through)."""
    logger = logging.getLogger("llama-cpp-python")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def expected_quant_bytes(f16_bytes: int, qtype: str) -> int:
    """Upper estimate: small models keep more tensors at 8 bits (rows not divisible by 256 fall back)."""
    bits = max(GGUF_BITS_PER_WEIGHT[qtype], 4.5)
    return int(f16_bytes * min(1.0, bits / 16 * 1.25))


def quantize_gguf(f16_path: Path, out_path: Path, qtype: str, *, threads: int | None = None,
                  progress: ProgressFn = no_progress, check_space: bool = True) -> dict:
    """Quantise an f16 (or bf16) GGUF into `qtype` (e.g. "q4_k_m"), written atomically to out_path."""
    import llama_cpp

    f16_path, out_path = Path(f16_path), Path(out_path)
    if qtype not in QUANT_TYPES:
        raise ExportError(f"Unknown quantisation {qtype!r}; choose one of {', '.join(QUANT_TYPES)}")
    if check_space:
        ensure_free_space(out_path.parent, expected_quant_bytes(f16_path.stat().st_size, qtype))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}")
    params.nthread = threads or max(1, (os.cpu_count() or 2))
    progress(f"quantize-{qtype}", 0.0)
    with atomic_file(out_path) as temp, _quiet_llama_cpp():
        rc = llama_cpp.llama_model_quantize(str(f16_path).encode(), str(temp).encode(), ctypes.byref(params))
        if rc != 0 or not temp.is_file():
            raise ExportError(f"llama.cpp failed to quantise {f16_path.name} to {qtype} (code {rc}); "
                              "is the disk full?")
    progress(f"quantize-{qtype}", 1.0)
    return {"format": "gguf", "type": qtype, "path": str(out_path), "bytes": out_path.stat().st_size}
