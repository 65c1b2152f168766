"""Where a studio training step's time goes, beside peer_bench.py's `--kernel-profile` of the harness:
the worker's own training process (`lanner train`, the same TrainProcess, model loading, TRL trainer
and callbacks as a queued job; events to the terminal instead of Redis) on the random-weight Llama-3
8B shape, with torch's profiler over two steps after warm-up.

    python benchmarks/studio_profile.py OUT_DIR [--seq 2048 --bs 4 --rank 16] [--set max_grad_norm=0 ...]

Writes OUT_DIR/kernels-studio.txt (GPU time by kernel, per step; the same format as the harness's) and
prints one JSON line: wall ms a step against GPU-busy ms a step (the difference is the GPU idling while
the host prepares, logs or synchronises). On the GPU machine, after `source tools/device/env.sh`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "benchmarks"), str(REPO / "tests"), str(REPO / "tests" / "gpu")]

from gpu_helpers import long_rows, saved_llama3_8b  # noqa: E402
from support import TEST_CACHE  # noqa: E402

FIRST, STEPS = 8, 2  # profiled steps: after warm-up (autotuning, the memory plan)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--bs", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LANNER_LOCAL_MODEL_DIRS", str(TEST_CACHE / "gpu-models"))  # where the model is saved

    import torch
    import yaml
    from transformers import TrainerCallback

    from lanner.cli import local_train
    from lanner.worker.training import sft
    from peer_bench import write_kernel_profile

    class Profile(TrainerCallback):
        def __init__(self):
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                               torch.profiler.ProfilerActivity.CUDA])
            self.wall = None

        def on_step_begin(self, args_, state, control, **kwargs):
            if state.global_step == FIRST:
                torch.cuda.synchronize()
                self.profiler.start()
                self.wall = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            if state.global_step == FIRST + STEPS:
                torch.cuda.synchronize()
                self.wall = time.perf_counter() - self.wall
                self.profiler.stop()
                write_kernel_profile(self.profiler, args.out / "kernels-studio.txt", STEPS)
                busy = float(open(args.out / "kernels-studio.txt").readline().split()[2])
                print(json.dumps({"mode": "studio-profile", "set": args.set, "steps": STEPS,
                                  "wall_ms_per_step": round(self.wall * 1000 / STEPS, 1),
                                  "gpu_busy_ms_per_step": busy}), flush=True)

    profile = Profile()
    build_trainer = sft.build_trainer

    def profiled_trainer(*positional, **named):
        trainer = build_trainer(*positional, **named)
        trainer.add_callback(profile)
        return trainer

    sft.build_trainer = profiled_trainer
    model = saved_llama3_8b(TEST_CACHE / "gpu-models" / "llama3-8b-random", os.environ["LANNER_TEST_TOKENIZER_DIR"])
    dataset = args.out / "long.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in long_rows(args.bs * (FIRST + STEPS + 2))))
    hyperparameters = {"max_steps": FIRST + STEPS + 1, "batch_size": args.bs, "gradient_accumulation": 1,
                       "max_seq_len": args.seq, "packing": False, "save_steps": 100_000, "before_after_eval": False,
                       "warmup_ratio": 0.0}
    hyperparameters.update({key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)})
    config = args.out / "job.yaml"
    config.write_text(yaml.safe_dump({"method": "lora", "model": str(model), "hyperparameters": hyperparameters,
                                      "lora": {"rank": args.rank, "alpha": args.rank, "dropout": 0.0,
                                               "target_modules": "all-linear"}}))
    return local_train.train(config, dataset, args.out / "run")


if __name__ == "__main__":
    sys.exit(main())
