#!/usr/bin/env bash
# Issue 23's comparison on the H200 (docs/fp8.md), in parts that each fit one device call (600 s):
#   8b:       Llama-3 8B shape, seq 2048, batch 4, r16, all seven projections: (after saving the random weights
#             once) Unsloth bf16, then Lanner FP8 base (lanner8) on the default plan (graphed: its layer inputs in
#             host memory), the same with the inputs on the GPU (--offload off), lanner8 under the bar's
#             memory bound held physically (budget 0.74x and a cap of 0.75x Unsloth's peak on the process's GPU
#             memory, offloading on: a row that finishes ran within it), lanner8 with a 60 GiB budget, Lanner
#             bf16, Unsloth 4-bit; a summary line with the ratios against the bar
#   bar:      what the bar judges, alone (~300 s): Unsloth bf16, lanner8 on the default plan twice, lanner8 with a
#             60 GiB budget, the summary
#   13b:      the same on the Llama-2 13B shape (hidden 5120): lanner8, Lanner bf16, Unsloth bf16, Unsloth 4-bit
#   fidelity: benchmarks/fp8_fidelity.py, 300 steps of SmolLM2 (the built-in model: run
#             `source tools/device/env.sh` with the smollm2 parts carried, docs/device-runs.md; without the
#             bundle, benchmarks/fidelity_parts.sh)
#   all:      8b, 13b, fidelity in that order while the time lasts (each skipped run is written as such)
# Every process starts from the same weights (--same-weights) and data, so losses compare step by step.
# Usage, from the repository root, with .peers carried (and the .device bundle for fidelity):
#     OUT=dir bash benchmarks/fp8_round.sh PART [SECONDS]
set -o pipefail
part=${1:-all}; budget=${2:-570}; out=${OUT:?}
source benchmarks/round_common.sh
# lanner.kernels importable from this checkout for the peer_bench processes started here (run.py makes its own)
kernels_root=$(mktemp -d); mkdir "$kernels_root/lanner"; ln -s "$PWD/kernels" "$kernels_root/lanner/kernels"
cd benchmarks
versions torch triton transformers peft unsloth
bench() {  # bench TIMEOUT MODE MODEL [peer_bench options]: one peer_bench process, capped by the time left
  local t=$1; shift; local l; l=$(( $(left) - 5 )); (( l < t )) && t=$l
  (( t < 40 )) && { skip "$*"; return; }
  echo "=== $(date -u +%T) peer_bench $* ($(left) s left)"
  BENCH_STACKS_AFTER=$(( t - 8 )) timeout "$t" python3 run.py --models "$2" --systems "$1" --steps 4 --warmup 2 \
    --same-weights --stream --timeout "$t" --out "$out/results.jsonl" "${@:3}" | tail -4
}
variant() {  # variant TIMEOUT MODE MODEL OPTIONS...: peer_bench directly (run.py's variants are the lanner mode's)
  local t=$1; shift; local l; l=$(( $(left) - 5 )); (( l < t )) && t=$l
  (( t < 40 )) && { skip "$*"; return; }
  echo "=== $(date -u +%T) peer_bench $* ($(left) s left)"
  PYTHONPATH=$kernels_root:$PYTHONPATH timeout "$t" python3 peer_bench.py "$@" --steps 4 --warmup 2 --same-weights \
    | tail -1 | tee -a "$out/results.jsonl"
}
summary() {
  python3 - "$out/results.jsonl" <<'PY' | tee -a "$out/results.jsonl"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
runs = [r for r in rows if "tok_s" in r]
def find(mode, model, budget=None, offload=(None, "auto"), capped=False):
    """The last row of MODE on MODEL with that budget and offloading; capped: the last under a memory cap, whatever
    its budget (matched to the peer's peak)."""
    return next((r for r in reversed(runs) if r["mode"] == mode and r["model"] == model and bool(r.get("cap_gib")) == capped
                 and (capped or (r.get("budget") == budget and r.get("offload") in offload))), None)
for model in dict.fromkeys(r["model"] for r in runs):
    unsloth = find("unsloth", model)
    summary = {"summary": model}
    for name, row in (("lanner8", find("lanner8", model)), ("lanner8_inputs_on_gpu", find("lanner8", model, offload=("off",))),
                      ("lanner8_capped", find("lanner8", model, capped=True)),
                      ("lanner8_budget60", find("lanner8", model, 60.0)),
                      ("lanner_bf16", find("lanner", model)), ("unsloth4", find("unsloth4", model))):
        if row and unsloth:
            # a capped row's memory is the cap it finished under (everything it reserved stayed below it)
            memory = row.get("cap_gib") or row["peak_gib"]
            summary[name] = {"speed_vs_unsloth": round(row["tok_s"] / unsloth["tok_s"], 3),
                             "memory_vs_unsloth": round(memory / unsloth["peak_gib"], 3)}
    for name in ("lanner8", "lanner8_inputs_on_gpu", "lanner8_capped"):
        if name in summary:
            summary[f"bar_{name}"] = summary[name]["speed_vs_unsloth"] >= 1.6 and summary[name]["memory_vs_unsloth"] <= 0.75
    if "lanner8_budget60" in summary:
        summary["bar_budget60"] = summary["lanner8_budget60"]["speed_vs_unsloth"] >= 2.0
    print(json.dumps(summary))
PY
}
if [[ $part == 8b || $part == all ]]; then
  save_weights llama-8b 150
  bench 200 unsloth llama-8b
  bench 150 lanner8 llama-8b
  variant 150 lanner8 llama-8b --offload off
  bound=$(peak_times unsloth llama-8b 2048 4 "--budget %.2f --offload on --cap-gib %.2f" 0.74 0.75)
  [[ -n $bound ]] && variant 150 lanner8 llama-8b $bound
  variant 150 lanner8 llama-8b --budget 60
  bench 150 lanner llama-8b
  bench 200 unsloth4 llama-8b
  summary
fi
if [[ $part == bar ]]; then
  save_weights llama-8b 150
  bench 200 unsloth llama-8b
  bench 150 lanner8 llama-8b
  bench 150 lanner8 llama-8b
  variant 150 lanner8 llama-8b --budget 60
  summary
fi
if [[ $part == 13b || $part == all ]]; then
  bench 180 lanner8 llama2-13b
  bench 180 lanner llama2-13b
  save_weights llama2-13b 150
  bench 240 unsloth llama2-13b
  bench 240 unsloth4 llama2-13b
  summary
fi
if [[ $part == fidelity || $part == all ]]; then
  (( $(left) < 200 )) && skip fidelity || {
    echo "=== $(date -u +%T) fp8_fidelity ($(left) s left)"
    (cd .. && source tools/device/env.sh >/dev/null && timeout $(( $(left) - 5 )) python3 -P benchmarks/fp8_fidelity.py \
      --out "$out/fp8_fidelity.json" 2> >(tail -30 >&2) | tail -c 600)
  }
fi
echo "=== done, $(( SECONDS - start )) s"
