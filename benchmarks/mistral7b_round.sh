#!/usr/bin/env bash
# Issue 21's open Mistral-7B rows in one device call (docs/benchmarks.md, ninth round):
#   (a) Lanner, mistral-7b, 8192 x 1 (the window 4096 < sequence: FlexAttention), progress on stderr
#   (b) the random weights saved once to /tmp/rand-mistral-7b, timed; then Unsloth at 8192 x 1
#   (c) Lanner and Unsloth at 4096 x 2, then a kernel profile of Lanner on mistral-1b 4096 x 2, while time remains
# Every process starts from the same weights (--same-weights) and data, so the per-step losses compare.
# Usage, from the repository root, with .peers carried:  OUT=dir bash benchmarks/mistral7b_round.sh [SECONDS]
set -o pipefail
budget=${1:-540}; out=${OUT:?}
source benchmarks/round_common.sh
cd benchmarks
versions torch triton transformers peft unsloth unsloth_zoo
one 150 --models mistral-7b --systems lanner --seq 8192 --bs 1
save_weights mistral-7b
one 240 --models mistral-7b --systems unsloth --seq 8192 --bs 1
one 110 --models mistral-7b --systems lanner --seq 4096 --bs 2
one 200 --models mistral-7b --systems unsloth --seq 4096 --bs 2
if (( $(left) > 60 )); then
  echo "=== $(date -u +%T) kernel profile, Lanner mistral-1b 4096 x 2"
  python3 run.py --models mistral-1b --systems lanner --seq 4096 --bs 2 --steps 4 --warmup 2 \
    --kernel-profile-dir "$out" --timeout $(( $(left) - 5 )) --out "$out/results.jsonl"
fi
echo "=== done, $(( SECONDS - start )) s"
