"""What a process of a job on several devices is: its rank among the job's processes, the world size,
the Trainer arguments of its share, and agreeing with the other ranks. In a job on one device (no
launcher, no RANK or WORLD_SIZE in the environment) it is rank 0 of 1."""
from __future__ import annotations

import os

# Set by the launcher for its ranks: how the job spreads ("ddp" or "fsdp"), and the launcher's pid.
STRATEGY_ENV = "LANNER_DISTRIBUTED_STRATEGY"
LAUNCHER_PID_ENV = "LANNER_LAUNCHER_PID"


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    """Rank 0 of a multi-process job, or the only process of a single-device one."""
    return rank() == 0


def any_rank(flag: bool) -> bool:
    """Whether `flag` is set on any rank (every rank must call it at the same point): what lets all
    ranks stop at the same step when the cancel's SIGTERM reached them at different moments."""
    if world_size() == 1:
        return flag
    import torch  # only a multi-process job's training needs it; the worker imports this module too
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    value = torch.tensor([1 if flag else 0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def trainer_args(cuda: bool) -> dict:
    """The Trainer's arguments for this process's share of a multi-process job ({} for one process)."""
    if world_size() == 1:
        return {}
    args = {"ddp_find_unused_parameters": False, "ddp_backend": "nccl" if cuda else "gloo"}
    if os.environ.get(STRATEGY_ENV) == "fsdp":
        # use_orig_params: LoRA's trainable and the frozen weights share FSDP's flat parameters.
        args.update(fsdp="full_shard auto_wrap", fsdp_config={"use_orig_params": True, "sync_module_states": True})
    return args
