"""What from_pretrained needs beyond the dtype to load a base checkpoint for training, merging or checking.

gpt-oss ships its experts in MXFP4. transformers keeps them in MXFP4 where its kernels are installed (a
GPU with the `kernels` package), and MXFP4 weights neither train nor take a LoRA merge; elsewhere it
dequantises them on its own. Asked explicitly, it always dequantises to the load's dtype and drops the
quantization config, so what trains, merges and saves is a plain 16- or 32-bit model.
"""
from __future__ import annotations

import os
from typing import Any


def base_load_kwargs(path: str | os.PathLike) -> dict[str, Any]:
    """from_pretrained's extra arguments for the checkpoint at `path` (a folder or a hub id); none where its
    config cannot be read (from_pretrained then says why, or a check before it fails the job first)."""
    from transformers import AutoConfig, Mxfp4Config

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return {}
    quantization = getattr(config, "quantization_config", None)
    method = (quantization.get("quant_method") if isinstance(quantization, dict)
              else getattr(quantization, "quant_method", None))
    return {"quantization_config": Mxfp4Config(dequantize=True)} if method == "mxfp4" else {}
