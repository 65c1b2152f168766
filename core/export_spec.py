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


class CheckFigure(BaseModel):
    """One figure a format's check judged, as its owner reads it: what was measured, the bound it had
    to stay within, what a miss means."""
    figure: str = Field(description="What was measured, in words: max |logit diff|, mean KL (nats), …")
    measured: float
    bound: float
    within: Literal["at most", "at least"] = Field(default="at most", description="How measured must compare to bound")
    passed: bool
    meaning: str = Field(description="What a miss says about the file")


class FormatOutcome(BaseModel):
    """What became of one format an export was asked for, with the figures its check judged (a failed
    one: at least one of them missed its bound) and what to do about a format left out."""
    status: FormatStatus
    reason: str | None = Field(default=None, description="Why it was left out, in words")
    figures: list[CheckFigure] = []
    advice: str | None = Field(default=None, description="What to do instead")


# What a figure's miss means (by its key in a check's result, lanner.worker.export.verify), in words.
FIGURE_MEANINGS: dict[str, tuple[str, str]] = {
    "max_abs_logit_diff": ("max |logit diff|", "the merged model's logits differ from the trained model's by more "
                                               "than one rounding of its dtype allows"),
    "float32_merge_max_abs_logit_diff": ("max |logit diff| of the float32 merge",
                                         "merged in float32, before any rounding, the model already differs from "
                                         "the base with its adapter: the merge itself is wrong"),
    "top1_mismatches": ("top-1 mismatches (not near-ties)", "the file's most likely next token differs from the "
                                                            "trained model's where the choice was not a near-tie"),
    "tensors_differing": ("tensors differing", "some tensors are not the trained ones rounded to the 16-bit dtype"),
    "mean_kl": ("mean KL (nats per position)", "llama.cpp's next-token distribution differs from the merged "
                                               "model's by more than this type's bound"),
    "tokenization_mismatches": ("prompts tokenized differently", "llama.cpp splits text into other tokens than the "
                                                                 "model's own tokenizer"),
    "generated_characters": ("characters generated", "llama.cpp generated no text from the file"),
    "loads": ("loads in llama.cpp", "llama.cpp refused to load the file"),
}


def format_advice(format_name: str, status: FormatStatus, merged_dtype: str | None = None,
                  has_adapter: bool = True) -> str | None:
    """What to do about a format an export left out (None for one it kept)."""
    if status == FormatStatus.not_made:
        return "Fix the merged model first (its row says why): GGUF files are converted from it."
    if status != FormatStatus.failed:
        return None
    if format_name == "merged":
        other = "float16 (8 times finer rounding)" if merged_dtype == "bfloat16" else "bfloat16 (float16's range may be too small for this model)"
        exact = ("the adapter with its base model, which is exact (export it with the adapter ticked)" if has_adapter
                 else "the trained model's own files (the job's model artifact), which are exact")
        return f"Export the merged model again in {other}, or use {exact}."
    if format_name in ("gguf-f16", "gguf-bf16"):
        return ("Use the merged model (transformers, vLLM) instead; llama.cpp may not support this model's "
                "architecture the way the converter wrote it.")
    return "Export a larger GGUF type (q8_0, or f16), or use the merged model."
