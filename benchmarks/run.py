"""Side-by-side LoRA training benchmark: every system on every shape, one process each, one run.

    python benchmarks/run.py                       # 1B and 8B shapes; hf, liger, unsloth, lanner
    python benchmarks/run.py --models llama-1b --systems hf lanner --steps 5
    python benchmarks/run.py --models llama-8b --systems hf4 unsloth4 lanner4   # QLoRA (NF4) rows
    python benchmarks/run.py --models llama-8b --systems unsloth lanner \
        --lanner-variants offload=on budget=19.4,offload=on budget=60   # memory-engine rows
    python benchmarks/run.py --models qwen3-8b --systems unsloth4 --lanner-variants budget=9 --variant-system lanner4

Each (shape, system) runs `peer_bench.py MODE MODEL` in a fresh process (so no system's patches or
allocator state leak into another's) and prints one JSON line; this script collects them, prints a
table with Lanner's ratios and writes all lines to --out. The peers need .peers/site (see
../shared/tools/peers.sh) on PYTHONPATH; lanner.kernels is made importable from this checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from qlora_modes import QLORA_SYSTEMS

REPO = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().with_name("peer_bench.py")
SYSTEMS = {"hf": "HF + PEFT", "liger": "HF + PEFT + Liger", "unsloth": "Unsloth", "lanner": "Lanner"}
DEFAULT_SYSTEMS = list(SYSTEMS)
SYSTEMS.update(QLORA_SYSTEMS)  # 4-bit rows, compared with lanner4
SYSTEMS["lanner8"] = "Lanner, FP8 base"  # docs/fp8.md
# The rows a Lanner variant is matched to, the first found of the same shape: Unsloth (4-bit for 4-bit Lanner),
# else the peer issue 21 compares with where Unsloth cannot run (Liger; bitsandbytes in 4 bits).
VARIANT_PEERS = {"lanner": ("unsloth", "liger"), "lanner4": ("unsloth4", "hf4"), "lanner8": ("unsloth",)}


def lanner_import_root() -> Path:
    """A folder holding lanner/kernels -> this checkout's kernels/, for a machine where lanner is not installed."""
    root = Path(tempfile.mkdtemp(prefix="lanner-import-"))
    (root / "lanner").mkdir()
    (root / "lanner" / "kernels").symlink_to(REPO / "kernels", target_is_directory=True)
    return root


def environment() -> dict:
    paths = [str(lanner_import_root()), str(REPO / ".peers" / "site"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "PYTHONUNBUFFERED": "1"}


def variant_args(variant: str) -> list[str]:
    """'budget=19.4,offload=on' -> ['--budget', '19.4', '--offload', 'on'] (peer_bench's lanner options; also
    graphs=off: the layers without CUDA graphs, and cap=GIB: the process's GPU memory capped, --cap-gib)."""
    options = {"budget": "--budget", "offload": "--offload", "graphs": "--graphs", "cap": "--cap-gib"}
    pairs = [item.split("=", 1) for item in variant.split(",") if item]
    if any(len(pair) != 2 or pair[0] not in options for pair in pairs):
        raise SystemExit(f"bad --lanner-variants entry {variant!r}: expected budget=GIB, offload=on|off|auto, "
                         "graphs=on|off and/or cap=GIB")
    return [arg for key, value in pairs for arg in (options[key], value)]


def run_one(system: str, model: str, args, env: dict, extra: list[str] = ()) -> dict:
    command = [sys.executable, str(BENCH), system, model, "--seq", str(args.seq), "--bs", str(args.bs),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--rank", str(args.rank), *extra]
    if args.same_weights:
        command.append("--same-weights")
    if args.kernel_profile_dir:
        command += ["--kernel-profile", str(args.kernel_profile_dir / f"kernels-{system}-{model}-{args.seq}x{args.bs}.txt")]
    try:
        # --stream: the process's stderr (its progress lines, the peers' logs) goes straight through, so
        # that a process that times out still shows where its time went
        done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=None if args.stream else subprocess.PIPE,
                              text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(mode=system, model=model, seq=args.seq, bs=args.bs, error=f"timed out after {args.timeout} s")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return dict(mode=system, model=model, seq=args.seq, bs=args.bs, error=f"exit {done.returncode}: {' | '.join(tail)}")


def shape_of(result: dict) -> tuple:
    """What a result's ratios compare within: the model, the sequence length and the batch."""
    return result["model"], result.get("seq"), result.get("bs")


def shape_label(result: dict) -> str:
    model, seq, bs = shape_of(result)
    return model if seq is None else f"{model} {seq}x{bs}"


def table(results: list[dict]) -> str:
    """One row per result, Lanner's ratios against the others of the same model, sequence and batch."""
    rows = ["| shape | system | tokens/s | step ms | peak GiB | first-step loss | final loss | Lanner tok/s ratio "
            "| Lanner memory ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys(map(shape_of, results)):
        shape = [r for r in results if shape_of(r) == key]
        label = shape_label(shape[0])
        lanner = {mode: next((r for r in shape if r["mode"] == mode and "error" not in r), None)
                  for mode in ("lanner", "lanner4")}
        for r in shape:
            ours = lanner["lanner4" if r["mode"] in QLORA_SYSTEMS else "lanner"]
            name = SYSTEMS.get(r["mode"], r["mode"])
            if "error" in r:
                rows.append(f"| {label} | {name} | failed: {r['error']} | | | | | | |")
                continue
            speed = f"{ours['tok_s'] / r['tok_s']:.2f}x" if ours else "-"
            memory = f"{ours['peak_gib'] / r['peak_gib']:.2f}x" if ours and r["peak_gib"] else "-"  # (0 on the CPU)
            first = r.get("losses", ["-"])[0]
            rows.append(f"| {label} | {name} | {r['tok_s']:,} | {r['step_ms']} | {r['peak_gib']} | {first} | {r['loss']} "
                        f"| {speed} | {memory} |")
    return "\n".join(rows)


def variants_table(results: list[dict]) -> str:
    rows = ["| shape | Lanner variant | plan | tokens/s | step ms | peak GiB | predicted peak GiB | final loss "
            "| peer | tok/s vs peer | memory vs peer |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "variant" not in r or "error" in r:
            if "variant" in r:
                rows.append(f"| {shape_label(r)} | {r['variant']} | failed: {r['error']} | | | | | | | | |")
            continue
        peers = (p for mode in VARIANT_PEERS[r.get("mode", "lanner")] for p in results
                 if p.get("mode") == mode and "error" not in p and "variant" not in p and shape_of(p) == shape_of(r))
        peer = next(peers, None)
        name = SYSTEMS[peer["mode"]] if peer else "-"
        speed = f"{r['tok_s'] / peer['tok_s']:.2f}x" if peer else "-"
        # Under a cap (--cap-gib), which bounded every step, the row's memory is the most its allocator reserved in
        # the timed steps; the peak beside it counts the capture step's working memory twice (docs/memory-engine.md).
        used = r["reserved_gib"] if "cap_gib" in r else r["peak_gib"]
        memory = f"{used / peer['peak_gib']:.2f}x" if peer and peer["peak_gib"] else "-"
        peak = f"{r['peak_gib']} ({used} reserved, cap {r['cap_gib']})" if "cap_gib" in r else r["peak_gib"]
        rows.append(f"| {shape_label(r)} | {r['variant']} | {r.get('plan', '-')} | {r['tok_s']:,} | {r['step_ms']} "
                    f"| {peak} | {r.get('predicted_peak_gib', '-')} | {r['loss']} | {name} | {speed} "
                    f"| {memory} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama-1b", "llama-8b"])
    parser.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, choices=list(SYSTEMS))
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--bs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--timeout", type=int, default=400, help="seconds per (shape, system) process")
    parser.add_argument("--kernel-profile-dir", type=Path, default=None,
                        help="write each process's GPU time by kernel (peer_bench --kernel-profile) into this folder")
    parser.add_argument("--stream", action="store_true", help="pass each process's stderr through as it runs")
    parser.add_argument("--same-weights", action="store_true",
                        help="lanner/hf/liger start from the weights the loaders read (peer_bench --same-weights)")
    parser.add_argument("--out", type=Path, default=None, help="write every result as one JSON line here")
    parser.add_argument("--lanner-variants", nargs="*", default=[],
                        help="extra Lanner runs per shape, each e.g. budget=19.4,offload=on (memory engine) or graphs=off")
    parser.add_argument("--variant-system", default="lanner", choices=list(VARIANT_PEERS),
                        help="the Lanner mode the --lanner-variants run as (lanner4: QLoRA, lanner8: FP8 base)")
    args = parser.parse_args()

    env = environment()
    results = []
    for model in args.models:
        runs = [(system, None) for system in args.systems] + [(args.variant_system, v) for v in args.lanner_variants]
        for system, variant in runs:
            result = run_one(system, model, args, env, variant_args(variant) if variant else [])
            if variant:
                result["variant"] = variant
            print(json.dumps(result), flush=True)
            results.append(result)
            if args.out:
                with args.out.open("a") as out:
                    out.write(json.dumps(result) + "\n")
    print(table([r for r in results if "variant" not in r]), flush=True)
    if args.lanner_variants:
        print(variants_table(results), flush=True)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
