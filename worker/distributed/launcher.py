"""A job on several devices: the job's process, which starts its ranks under torch's elastic launcher
(what `torchrun --standalone` runs).

    python -m lanner.worker.distributed.launcher <job id> --nproc N --strategy ddp|fsdp

The worker runs this as the job's process (lanner.worker.runner), with CUDA_VISIBLE_DEVICES naming
the devices it reserved. The launcher starts N ranks on this machine, each
`python -m lanner.worker.distributed.rank_process <job id>`. DDP keeps a replica of the model on
every device; FSDP shards it, for a model that does not fit one device.

- Only rank 0 publishes events and writes artifacts (lanner.worker.events; train_process).
- Cancel: the worker's SIGTERM reaches every rank through the launcher; the ranks agree on the step
  to stop at (`ranks.any_rank`), save a checkpoint and exit with EXIT_CANCELLED.
- A rank that fails or dies: the launcher stops the others, writes the job's error naming that
  rank (unless the rank wrote its own reason) and exits 1.
- Every rank dies with the launcher (PDEATHSIG), which dies with the worker.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import get_args

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from lanner.core.db import session_factory
from lanner.core.messages.device import Strategy
from lanner.core.models import Job
from lanner.core.settings import get_settings
from lanner.worker.distributed.ranks import LAUNCHER_PID_ENV, STRATEGY_ENV
from lanner.worker.job_process import EXIT_CANCELLED, EXIT_FAILED

RANK_MODULE = "lanner.worker.distributed.rank_process"


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


def _record_failure(job_id: int, failures: dict[int, tuple[int, str]], first_rank: int, world: int) -> None:
    with session_factory(get_settings().database_url)() as session:
        job = session.get(Job, job_id)
        job.error = failure_reason(failures, first_rank, world, job.error)
        session.commit()


def launch(job_id: int, nproc: int, strategy: Strategy) -> int:
    os.environ[STRATEGY_ENV] = strategy
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    # torchrun --standalone: a rendezvous of this machine's ranks only, on a free port.
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"lanner-job-{job_id}-{os.getpid()}",
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.5)
    try:
        elastic_launch(config, sys.executable)("-u", "-m", RANK_MODULE, str(job_id))
        return 0
    except SignalException:  # a cancel, or the worker stopping: the ranks got the signal too and stopped
        return EXIT_CANCELLED
    except ChildFailedError as error:
        failures = {rank: (failure.exitcode, failure.message) for rank, failure in error.failures.items()}
        if all(code == EXIT_CANCELLED for code, _ in failures.values()):
            return EXIT_CANCELLED
        first_rank, _ = error.get_first_failure()
        _record_failure(job_id, failures, first_rank, nproc)
        return EXIT_FAILED


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m lanner.worker.distributed.launcher")
    parser.add_argument("job_id", type=int)
    parser.add_argument("--nproc", type=int, required=True)
    parser.add_argument("--strategy", choices=get_args(Strategy), default="ddp")
    args = parser.parse_args(argv)
    return launch(args.job_id, args.nproc, args.strategy)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
