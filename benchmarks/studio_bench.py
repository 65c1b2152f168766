"""Tokens/s of a LoRA job through the whole studio (issue 20), to set beside peer_bench.py's figure
for the same shape and settings: `lanner up` on SQLite, a job created through the API on the
random-weight Llama-3 8B shape, its per-step metrics read back from the job's WebSocket stream.

    python benchmarks/studio_bench.py [--seq 2048 --bs 4 --rank 16 --steps 30 --warmup 5] [--budget GIB]
                                      [--set max_grad_norm=0 ...]

Prints one JSON line like peer_bench.py's (mode "studio"), with the memory plan the job chose and
its budget, so that `run.py --lanner-variants budget=<that>` runs the harness on the same plan.
Uses the tests' helpers (tests/support.py, tests/gpu/gpu_helpers.py), which start the studio as
`lanner up` does; on the GPU machine, after `source tools/device/env.sh`.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "gpu")]

from gpu_helpers import StudioClient, long_rows, saved_llama3_8b  # noqa: E402
from support import TEST_CACHE, RunningStack, free_port, stack_env  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--bs", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    parser.add_argument("--budget", type=float, default=None, help="memory_budget_gib (default: the studio's pick)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                        help="another hyperparameter of the job, e.g. max_grad_norm=0 (repeatable)")
    args = parser.parse_args()

    models = TEST_CACHE / "gpu-models"
    model = saved_llama3_8b(models / "llama3-8b-random", os.environ["LANNER_TEST_TOKENIZER_DIR"])
    tmp = Path(tempfile.mkdtemp(prefix="studio-bench-"))
    env = stack_env(tmp, f"redis://127.0.0.1:{free_port()}/0")
    env["LANNER_LOCAL_MODEL_DIRS"] = str(models)
    stack = RunningStack(tmp / "data", env).wait_up()
    try:
        studio = StudioClient.signed_up(stack.url)
        dataset = studio.upload("long.jsonl", long_rows(args.bs * args.steps))
        hyperparameters = {"max_steps": args.steps, "batch_size": args.bs, "gradient_accumulation": 1,
                           "max_seq_len": args.seq, "packing": False, "save_steps": 100_000,
                           "before_after_eval": False, "warmup_ratio": 0.0, "memory_budget_gib": args.budget}
        hyperparameters.update({key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)})
        job = studio.request("POST", "/api/jobs", {
            "method": "lora", "model": str(model), "dataset_id": dataset, "hyperparameters": hyperparameters,
            "lora": {"rank": args.rank, "alpha": args.rank, "dropout": 0.0, "target_modules": "all-linear"}})
        done = studio.wait(job["id"], 900)
        logs = studio.logs(job["id"])
        if done["status"] != "succeeded":
            print(json.dumps({"mode": "studio", "error": done["error"], "log": logs[-20:]}))
            return 1
        steps = [m for m in studio.of_type(job["id"], "metric") if "tokens_per_second" in m]
        timed = steps[args.warmup:]
        plan = next((line for line in logs if line.startswith("lanner.kernels memory plan")), None)
        budget = next((float(found.group(1)) for line in logs
                       if (found := re.search(r"budget (\d+(?:\.\d+)?) GiB", line))), None)
        started, finished = (datetime.fromisoformat(done[key]) for key in ("started_at", "finished_at"))
        peak = max(sample["memory_used_bytes"] for sample in studio.of_type(job["id"], "device"))
        print(json.dumps({
            "mode": "studio", "set": args.set, "model": "llama-8b", "seq": args.seq, "bs": args.bs, "rank": args.rank,
            "tok_s": round(statistics.median(m["tokens_per_second"] for m in timed)),
            "step_ms": round(statistics.median(m["step_time"] for m in timed) * 1000, 1),
            "tokens_per_step": round(statistics.median(m["tokens_per_second"] * m["step_time"] for m in timed)),
            "budget_gib": budget, "plan": plan, "losses": [round(m["loss"], 4) for m in steps],
            "job_wall_s": round((finished - started).total_seconds(), 1), "nvml_peak_gib": round(peak / 2**30, 2),
            "memory_estimate_gib": round(done["memory_estimate_bytes"] / 2**30, 2),
            "log": [line for line in logs if "kernels" in line or "Memory engine" in line or "Model " in line]}))
        return 0
    finally:
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
