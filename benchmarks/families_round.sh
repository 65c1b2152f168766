#!/usr/bin/env bash
# Issue 21's benchmark grid in one device call (docs/benchmarks.md, "Next: the families grid"). For each shape,
# in the order given: the random weights saved once for Unsloth's loader, Unsloth at 2048 x 4, then Lanner at its
# default plan and under a memory budget of 1.09x Unsloth's measured peak (with offloading: the bar's memory
# bound of 1.1x, spent on kept layers) with the process's GPU memory capped at 1.1x that peak (the bound itself,
# held at every moment of the run, graph captures included), then the same at 8192 x 1; where Unsloth fails on a
# shape, HF + PEFT + Liger instead and Lanner's two rows matched to it, at that length and the next. Every process starts from the
# same weights and batches (--same-weights), so first-step losses compare. Per-process timeouts from the ninth
# round (7B: Lanner 28-76 s, of it ~50 s FlexAttention's first compile on windowed or soft-capped shapes; Unsloth
# 60-77 s), each capped by what is left of BUDGET; what does not fit is written as skipped. A shape's saved weights (15-24 GB) are
# deleted when it is done (/tmp holds 64 GiB). Ends with run.py's table of everything in results.jsonl.
# METHOD=qlora runs the same grid in 4 bits: Unsloth 4-bit, Lanner 4-bit (its variants too) and, where Unsloth
# fails, HF + PEFT + bitsandbytes instead of Liger. At each length, last, plain HF + PEFT (bitsandbytes in 4
# bits) from the same weights: the reference the bar's losses compare with (REFERENCE=off leaves it out).
# Usage, from the repository root, with .peers carried:
#     OUT=dir [METHOD=lora|qlora] [LENGTHS="2048x4 8192x1"] [UNSLOTH=off] bash benchmarks/families_round.sh [BUDGET] [SHAPE...]
# (LENGTHS: the seq x batch pairs, in order; one of them alone finishes a shape's missing row in a short call;
# UNSLOTH=off: straight to the fallback peer, for shapes Unsloth is known to fail on, e.g. Gemma 1 on torch 2.11)
# Default shapes, most decisive first: qwen2.5-7b qwen3-8b (plain causal attention: no compile, Unsloth's
# own fast paths), gemma2-9b (soft-caps, windows), phi-4-mini, gemma3-12b (Unsloth's generic FastModel path).
set -o pipefail
budget=${1:-560}; out=${OUT:?}
shapes=("${@:2}"); (( ${#shapes[@]} )) || shapes=(qwen2.5-7b qwen3-8b gemma2-9b phi-4-mini gemma3-12b)
source benchmarks/round_common.sh
case ${METHOD:-lora} in
  lora) unsloth=unsloth lanner=lanner fallback=liger reference=hf ;;
  qlora) unsloth=unsloth4 lanner=lanner4 fallback=hf4 reference=hf4 ;;
  *) echo "METHOD must be lora or qlora, not $METHOD" >&2; exit 2 ;;
esac
# peer_bench's MATCHED_BUDGET and MATCHED_CAP: Lanner's matched rows run under these multiples of the peer's peak
matched=$(cd benchmarks && python3 -c "from peer_bench import MATCHED_BUDGET, MATCHED_CAP; print(MATCHED_BUDGET, MATCHED_CAP)")
lanner_rows() {  # lanner_rows PEER SEQ BS: Lanner's default plan, and under the budget and cap matched to PEER's peak
  local variant; variant=$(peak_times "$1" "$shape" "$2" "$3" "budget=%.2f,offload=on,cap=%.2f" $matched)
  one 200 --models "$shape" --systems "$lanner" --seq "$2" --bs "$3" --variant-system "$lanner" \
    ${variant:+--lanner-variants $variant}
}
cd benchmarks
versions torch triton transformers peft unsloth unsloth_zoo liger-kernel
for shape in "${shapes[@]}"; do
  unsloth_runs=$([[ ${UNSLOTH:-on} == off ]] && echo 0 || echo 1)
  for length in ${LENGTHS:-2048x4 8192x1}; do
    IFS=x read -r seq bs <<< "$length"
    peer=$unsloth
    if (( unsloth_runs )); then
      [[ -e /tmp/rand-$shape/tokenizer.json ]] || save_weights "$shape"
      one 240 --models "$shape" --systems "$unsloth" --seq "$seq" --bs "$bs" || unsloth_runs=0
    fi
    if (( ! unsloth_runs )); then  # failed on this shape: Liger (bitsandbytes in 4 bits) instead, here and at the other length
      peer=$fallback
      one 150 --models "$shape" --systems "$fallback" --seq "$seq" --bs "$bs"
    fi
    lanner_rows "$peer" "$seq" "$bs"
    [[ ${REFERENCE:-on} == off || $peer == "$reference" ]] || one 150 --models "$shape" --systems "$reference" --seq "$seq" --bs "$bs"
  done
  rm -rf "/tmp/rand-$shape"
done
python3 - "$out/results.jsonl" <<'PY'
import json, sys
from run import table, variants_table
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
print(table([r for r in rows if "mode" in r and "variant" not in r]))
print(variants_table([r for r in rows if "mode" in r]))
PY
echo "=== done, $(( SECONDS - start )) s"
