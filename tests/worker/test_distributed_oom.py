"""A rank of a job on two devices runs out of memory (for real, on the CPU, under the job's memory cap):
the job fails at once, naming the rank and a smaller per-device micro-batch, instead of one rank
retrying alone while the others wait for it."""
from __future__ import annotations

import re
import subprocess
import sys

from test_methods_oom import LONG, LONG_ROWS
from worker_helpers import REPO


def test_a_rank_out_of_memory_fails_the_job_naming_the_rank_and_a_smaller_micro_batch(studio):
    job_id = studio.job(studio.dataset("long.jsonl", LONG_ROWS), {"hyperparameters": {**LONG, "memory_limit_mb": 150}}, gpus=2)
    done = subprocess.run([sys.executable, "-m", "lanner.worker.distributed.launcher", str(job_id), "--nproc", "2",
                           "--strategy", "ddp"], cwd=REPO, env=studio.env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    error = studio.get_job(job_id).error
    assert re.match(r"Rank [01] of 2 ran out of memory: Out of memory at step 1 with micro-batch 4 x 1 accumulation "
                    r"steps and sequence length 128; a job on several devices is not retried automatically\. Try a "
                    r"per-device micro-batch \(batch_size\) below 4 with more gradient accumulation, ", error), error
    assert error.endswith(" or a higher memory_limit_mb."), error
