"""One job on several devices, under torch's elastic launcher (what `torchrun` runs).

    python -m lanner.worker.distributed launch <job id> --nproc N --strategy ddp|fsdp

The worker runs this launcher as the job's process (lanner.worker.runner), with CUDA_VISIBLE_DEVICES
naming the devices it reserved. The launcher starts N ranks on this machine, each
`python -m lanner.worker.distributed rank <job id>`: the ordinary training process
(lanner.worker.train_process) on the device of its LOCAL_RANK, in a process group that the
Trainer joins (NCCL on GPUs, gloo on the CPU). DDP keeps a replica of the model on every device;
FSDP shards it, for a model that does not fit one device.

- Only rank 0 publishes events and writes artifacts (lanner.worker.events; train_process).
- Cancel: the worker's SIGTERM reaches every rank through the launcher; the ranks agree on the step
  to stop at (`any_rank`), save a checkpoint and exit with EXIT_CANCELLED.
- A rank that fails or dies: the launcher stops the others, writes the job's error naming that
  rank (unless the rank wrote its own reason) and exits 1.
- Every rank dies with the launcher (PDEATHSIG), which dies with the worker.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

STRATEGY_ENV = "LANNER_DISTRIBUTED_STRATEGY"
LAUNCHER_PID_ENV = "LANNER_LAUNCHER_PID"
STRATEGIES = ("ddp", "fsdp")
_PR_SET_PDEATHSIG = 1


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
    import torch
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


def _die_with_launcher() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux
        return
    if os.environ.get(LAUNCHER_PID_ENV) and os.getppid() != int(os.environ[LAUNCHER_PID_ENV]):
        os._exit(1)  # the launcher died before prctl took effect


def rank_main(job_id: int) -> int:
    _die_with_launcher()
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank())  # so that "cuda" is this rank's device
    from lanner.core.models import Job
    from lanner.worker.job_process import EXIT_FAILED, JobFailed, main
    from lanner.worker.train_process import TrainProcess

    class RankProcess(TrainProcess):
        def fail(self, message: str) -> int:
            # The first rank to fail explains; the others then fail only at losing their peer.
            with self.sessions() as session:
                if session.get(Job, self.job_id).error:
                    print(f"rank {rank()}: {message}", file=sys.stderr, flush=True)
                    return EXIT_FAILED
            return super().fail(message)

        def retry_smaller(self, failure, *_):
            # The ranks train in step: a rank retrying alone would wait forever for the others.
            raise JobFailed(out_of_memory_reason(failure, rank(), world_size()))

    return main(RankProcess, [sys.argv[0], str(job_id)])


def out_of_memory_reason(failure, rank_: int, world: int) -> str:
    """The job's error when rank `rank_` ran out of memory (failure: the training's OutOfMemory). A job
    on several devices is not retried at a smaller micro-batch: every rank would have to retry together."""
    smaller = ([f"a per-device micro-batch (batch_size) below {failure.micro_batch} with more gradient accumulation"]
               if failure.micro_batch > 1 else [])
    tips = smaller + [tip for tip in failure.tips if "micro-batch" not in tip]
    return (f"Rank {rank_} of {world} ran out of memory: {failure.summary()}; a job on several devices is not "
            f"retried automatically. Try {', '.join(tips[:-1])} or {tips[-1]}.")


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def failure_reason(failures: dict[int, tuple[int, str]], first_rank: int, world: int,
                   reported: str | None) -> str:
    """The job's error after rank `first_rank` failed first. failures: rank -> (exit code, message).
    A rank killed by a signal wrote nothing itself (what other ranks then wrote about their lost
    peer is beside the point); a rank that failed in Python wrote its reason, which is kept."""
    exitcode, message = failures[first_rank]
    if exitcode < 0:
        hint = (" — most likely out of memory (the system's OOM killer)" if exitcode == -signal.SIGKILL else "")
        return f"Rank {first_rank} of {world} was killed by {_signal_name(exitcode)}{hint}; every rank was stopped."
    if reported:
        return reported
    return f"Rank {first_rank} of {world} exited with code {exitcode}: {message}; every rank was stopped."


def _write_error(job_id: int, error: str) -> None:
    from lanner.core.db import session_factory
    from lanner.core.models import Job
    from lanner.core.settings import get_settings

    with session_factory(get_settings().database_url)() as session:
        session.get(Job, job_id).error = error
        session.commit()


def _reported_error(job_id: int) -> str | None:
    from lanner.core.db import session_factory
    from lanner.core.models import Job
    from lanner.core.settings import get_settings

    with session_factory(get_settings().database_url)() as session:
        return session.get(Job, job_id).error


def launch(job_id: int, nproc: int, strategy: str) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from lanner.worker.job_process import EXIT_CANCELLED, EXIT_FAILED

    os.environ[STRATEGY_ENV] = strategy
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    # torchrun --standalone: a rendezvous of this machine's ranks only, on a free port.
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"lanner-job-{job_id}-{os.getpid()}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.5)
    try:
        elastic_launch(config, sys.executable)("-u", "-m", "lanner.worker.distributed", "rank", str(job_id))
        return 0
    except SignalException:  # a cancel, or the worker stopping: the ranks got the signal too and stopped
        return EXIT_CANCELLED
    except ChildFailedError as error:
        failures = {rank: (failure.exitcode, failure.message) for rank, failure in error.failures.items()}
        if all(code == EXIT_CANCELLED for code, _ in failures.values()):
            return EXIT_CANCELLED
        first_rank, _ = error.get_first_failure()
        _write_error(job_id, failure_reason(failures, first_rank, nproc, _reported_error(job_id)))
        return EXIT_FAILED


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lanner.worker.distributed")
    commands = parser.add_subparsers(dest="command", required=True)
    launcher = commands.add_parser("launch", help="run a job on several devices (the worker runs this)")
    launcher.add_argument("job_id", type=int)
    launcher.add_argument("--nproc", type=int, required=True)
    launcher.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    one = commands.add_parser("rank", help="one rank of a job (the launcher runs this)")
    one.add_argument("job_id", type=int)
    args = parser.parse_args(argv)
    if args.command == "launch":
        return launch(args.job_id, args.nproc, args.strategy)
    return rank_main(args.job_id)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
