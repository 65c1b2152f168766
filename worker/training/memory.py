"""Running out of memory: recognising it, the job's optional memory cap, and the smaller micro-batch
an automatic retry uses.

The cap (`memory_limit_mb`) bounds what the training steps may allocate on top of what is in use
when training starts (the loaded model, the tokenized data): on a GPU through the caching
allocator's per-process fraction, on a CPU through the process's address-space limit
(RLIMIT_AS), so an allocation over it fails for real, exactly as a full device does. It lets a job
share a GPU, and lets the out-of-memory handling be tested on a CPU.
"""
from __future__ import annotations

import gc
import re
import resource
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from lanner.worker.training.options import SMALLEST_MICRO_BATCH, TrainingOptions

# RuntimeErrors that mean an allocation failed: the CPU allocator's, a C++ bad_alloc, CUDA's and cuBLAS'.
_OOM_MESSAGES = ("not enough memory", "can't allocate memory", "std::bad_alloc", "out of memory",
                 "cublas_status_alloc_failed")


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and any(text in str(error).lower() for text in _OOM_MESSAGES)


@dataclass(frozen=True)
class OutOfMemory:
    """Where and how a training attempt ran out of memory, in words for the job's owner."""
    step: int                   # the optimizer step that did not fit (1-based)
    micro_batch: int
    accumulation: int
    max_seq_length: int
    peak: str                   # " (peak X GiB of Y GiB)" on a GPU
    tips: tuple[str, ...]

    @classmethod
    def of(cls, options: TrainingOptions, trainer=None) -> "OutOfMemory":
        step = (trainer.state.global_step if trainer is not None else 0) + 1
        return cls(step, options.per_device_train_batch_size, options.gradient_accumulation_steps,
                   options.max_seq_length, peak_detail(), tuple(_tips(options)))

    @property
    def effective_batch(self) -> int:
        return self.micro_batch * self.accumulation

    def summary(self) -> str:
        return (f"Out of memory at step {self.step}{self.peak} with micro-batch {self.micro_batch} x "
                f"{self.accumulation} accumulation steps and sequence length {self.max_seq_length}")

    def message(self, retry: str, first: "OutOfMemory | None" = None) -> str:
        """retry: "off" (the job's oom_retry), "impossible" (the micro-batch cannot shrink) or
        "failed" (still out of memory after the retry; `first` is the attempt before it)."""
        why = {"off": "automatic retry is off (oom_retry)",
               "impossible": f"the micro-batch of {self.micro_batch} cannot be made smaller",
               "failed": f"also after the automatic retry (first at micro-batch {first and first.micro_batch} x "
                         f"{first and first.accumulation})"}[retry]
        return f"{self.summary()}; {why}. Try {', '.join(self.tips[:-1])} or {self.tips[-1]}."


def _tips(options: TrainingOptions) -> list[str]:
    tips = []
    if options.per_device_train_batch_size > 1:
        tips.append("a smaller micro-batch with more gradient accumulation")
    tips.append("a shorter max_seq_length")
    if not options.gradient_checkpointing:
        tips.append("gradient checkpointing")
    if not options.lora:
        tips.append("LoRA rather than training every weight")
    elif not options.load_in_4bit:
        tips.append("QLoRA")
    if options.memory_limit_mb:
        tips.append("a higher memory_limit_mb")
    else:
        tips.append("a device with more memory")
    return tips


def newest_checkpoint_folder(checkpoints: Path) -> Path | None:
    """The highest-step complete checkpoint (one the Trainer finished writing) in `checkpoints`."""
    found = [path for path in checkpoints.glob("checkpoint-*")
             if re.fullmatch(r"checkpoint-\d+", path.name) and (path / "trainer_state.json").is_file()]
    return max(found, key=lambda path: int(path.name.rsplit("-", 1)[1]), default=None)


def peak_detail() -> str:
    """" (peak X GiB of Y GiB)" on a GPU; empty on a CPU, where no allocator keeps a peak."""
    if not torch.cuda.is_available():
        return ""
    device = torch.cuda.current_device()
    peak, total = torch.cuda.max_memory_allocated(device), torch.cuda.get_device_properties(device).total_memory
    return f" (peak {peak / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)"


def release_memory() -> None:
    """Gives back what a failed attempt held, once nothing refers to its model and trainer."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def smaller_micro_batch(options: TrainingOptions) -> TrainingOptions | None:
    """Half the micro-batch and twice the accumulation; for an odd micro-batch, its largest divisor
    below the half, so the effective batch stays exactly the same. None when it cannot shrink."""
    micro = options.per_device_train_batch_size
    smallest = SMALLEST_MICRO_BATCH.get(options.method, 1)
    smaller = next((size for size in range(micro // 2, 0, -1) if micro % size == 0), None)
    if smaller is None or smaller < smallest:
        return None
    return options.with_micro_batch(smaller)


@contextmanager
def memory_limit(limit_mb: int | None):
    """Caps the memory allocated inside the block at `limit_mb` above what is in use when it starts."""
    if not limit_mb:
        yield
        return
    limit = int(limit_mb) * 2**20
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        total = torch.cuda.get_device_properties(device).total_memory
        fraction = min(1.0, (torch.cuda.memory_reserved(device) + limit) / total)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = psutil.Process().memory_info().vms + limit
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
