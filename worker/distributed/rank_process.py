"""One rank of a job on several devices: `python -m lanner.worker.distributed.rank_process <job id>`,
started by lanner.worker.distributed.launcher. It is the ordinary training process
(lanner.worker.train_process) on the device of its LOCAL_RANK, in the process group that the Trainer
joins (NCCL on GPUs, gloo on the CPU); it dies with the launcher (PDEATHSIG)."""
from __future__ import annotations

import ctypes
import os
import signal
import sys

import torch

from lanner.core.models import Job
from lanner.worker.distributed.ranks import LAUNCHER_PID_ENV, local_rank, rank, world_size
from lanner.worker.job_process import EXIT_FAILED, JobFailed, main
from lanner.worker.train_process import TrainProcess

_PR_SET_PDEATHSIG = 1


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


def out_of_memory_reason(failure, rank_: int, world: int) -> str:
    """The job's error when rank `rank_` ran out of memory (failure: the training's OutOfMemory). A job
    on several devices is not retried at a smaller micro-batch: every rank would have to retry together."""
    smaller = ([f"a per-device micro-batch (batch_size) below {failure.micro_batch} with more gradient accumulation"]
               if failure.micro_batch > 1 else [])
    tips = smaller + [tip for tip in failure.tips if "micro-batch" not in tip]
    return (f"Rank {rank_} of {world} ran out of memory: {failure.summary()}; a job on several devices is not "
            f"retried automatically. Try {', '.join(tips[:-1])} or {tips[-1]}.")


def _die_with_launcher() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux
        return
    if os.environ.get(LAUNCHER_PID_ENV) and os.getppid() != int(os.environ[LAUNCHER_PID_ENV]):
        os._exit(1)  # the launcher died before prctl took effect


if __name__ == "__main__":
    _die_with_launcher()
    if os.environ.get("CUDA_VISIBLE_DEVICES") and torch.cuda.is_available():
        torch.cuda.set_device(local_rank())  # so that "cuda" is this rank's device
    sys.exit(main(RankProcess, sys.argv))
