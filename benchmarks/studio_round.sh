#!/usr/bin/env bash
# Issue 20's throughput rows in one device call: a LoRA job through the whole studio on the Llama-3
# 8B shape (seq 2048, batch 4, r16, all seven projections, packing off, the default memory plan),
# then peer_bench.py's Lanner on the budget the studio picked (the same plan) and Unsloth, same shape.
# Usage, from the repository's root, with the .device bundle carried (docs/device-runs.md):
#     OUT=dir bash benchmarks/studio_round.sh
set -o pipefail
out=${OUT:?}
source tools/device/env.sh
python3 benchmarks/studio_bench.py --steps 25 --warmup 5 2> >(tail -40 >&2) | tee "$out/studio.json"
budget=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['budget_gib'])" "$out/studio.json") || exit 1
cd benchmarks
python3 run.py --models llama-8b --systems unsloth --lanner-variants "budget=$budget" --steps 8 --warmup 3 \
  --timeout 300 --out "$out/results.jsonl"
