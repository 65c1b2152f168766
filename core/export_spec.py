"""The export spec: which files an export of a finished training job writes. The API validates it and
stores it as the export job's config["export"]; the export process reads it back with the same
defaults; the web UI reads the types and defaults from the OpenAPI document."""
from __future__ import annotations

import enum
from typing import Literal, get_args

from pydantic import BaseModel, Field

# Every GGUF type an export writes, largest first, with its approximate bits per weight (what the
# export's disk check counts on). f16, bf16 and q8_0 come from Lanner's converter, the others from
# llama.cpp's quantizer, each named as llama.cpp names its file type (LLAMA_FTYPE_MOSTLY_<TYPE>).
GGUF_BITS_PER_WEIGHT: dict[str, float] = {
    "f16": 16, "bf16": 16, "q8_0": 8.5, "q6_k": 6.6, "q5_k_m": 6.1, "q5_k_s": 5.8, "q5_0": 5.5, "q5_1": 6.0,
    "q4_k_m": 5.3, "q4_k_s": 5.0, "q4_0": 4.5, "q4_1": 5.0, "q3_k_m": 4.3, "q2_k": 3.4,
}
GGUF_TYPES = tuple(GGUF_BITS_PER_WEIGHT)
CONVERTER_TYPES = ("f16", "bf16", "q8_0")
QUANTIZER_TYPES = tuple(qtype for qtype in GGUF_TYPES if qtype not in CONVERTER_TYPES)  # made with llama.cpp
GgufType = Literal[GGUF_TYPES]  # type: ignore[valid-type]
MergedDtype = Literal["bfloat16", "float16"]
MERGED_DTYPES = get_args(MergedDtype)


class FormatStatus(enum.StrEnum):
    """What became of one format an export was asked for (the manifest's `formats`, each artifact's
    `status`). An export keeps every format that passed and reports the others; it fails only when
    nothing it was asked for is kept."""
    verified = "verified"      # made and its check passed
    unchecked = "unchecked"    # made, no check asked (verify off) or none exists (the adapter: the trainer's tensors, copied)
    failed = "failed"          # its check failed: the file was removed
    not_made = "not made"      # made from a format that failed (a GGUF from the merged model)


class ExportSpec(BaseModel):
    adapter: bool = Field(default=True, description="The LoRA adapter in PEFT's layout")
    merged: bool = Field(default=True, description="The base model with the adapter merged in, 16-bit safetensors")
    merged_dtype: MergedDtype = "bfloat16"
    gguf_types: list[GgufType] = Field(default=["q8_0"], max_length=len(GGUF_TYPES),
                                       description="GGUF files for llama.cpp and Ollama, one per type",
                                       json_schema_extra={"x-llama-cpp-types": list(QUANTIZER_TYPES)})
    verify: bool = Field(default=True, description="Check every file against the trained model")

    def llama_cpp_uses(self) -> list[str]:
        """What of this export llama.cpp makes or checks: its k-quant (and other quantizer) GGUF types, and
        every GGUF file when verified. f16, bf16 and q8_0 are written without it."""
        uses = [f"GGUF {qtype}" for qtype in self.gguf_types if qtype in QUANTIZER_TYPES]
        if self.verify and self.gguf_types:
            uses.append("the check of the GGUF files")
        return uses
