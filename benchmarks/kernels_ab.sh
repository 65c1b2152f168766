#!/usr/bin/env bash
# A whole-step A/B of two versions of lanner.kernels in one device call: an earlier commit's kernels against
# this tree's, one peer_bench process each, in turns (so that a drift of the machine falls on both alike).
#   here:        bash benchmarks/kernels_ab.sh export REF        # -> .kernels-ab/REF/kernels (git-ignored)
#   the device:  OUT=$OUT bash benchmarks/kernels_ab.sh run REF [MODE] [MODEL] [ROUNDS] [peer_bench options]
#                (carry .kernels-ab; MODE lanner8, MODEL llama-8b, ROUNDS 2 by default)
# Each row of $OUT/ab.jsonl is peer_bench's JSON line with "kernels": REF or "tree"; each run's whole output (the
# memory plan among it) is in $OUT/ab-WHICH-ROUND.log.
set -euo pipefail
cd "$(dirname "$0")/.."
action=${1:?export or run}; ref=${2:?a commit}
if [[ $action == export ]]; then
  mkdir -p ".kernels-ab/$ref" && git archive "$ref" kernels | tar -x -C ".kernels-ab/$ref"
  grep -qx '/.kernels-ab/' .git/info/exclude 2>/dev/null || echo '/.kernels-ab/' >> .git/info/exclude
  echo ".kernels-ab/$ref/kernels ready: carry .kernels-ab"; exit 0
fi
mode=${3:-lanner8}; model=${4:-llama-8b}; rounds=${5:-2}; shift $(( $# < 5 ? $# : 5 ))
[[ -d .kernels-ab/$ref/kernels ]] || { echo "no .kernels-ab/$ref: run 'export $ref' here and carry .kernels-ab" >&2; exit 2; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.peers/site:${PYTHONPATH:-}
for (( i = 0; i < rounds; i++ )); do
  for which in "$ref" tree; do
    root=$(mktemp -d); mkdir "$root/lanner"
    if [[ $which == tree ]]; then ln -s "$PWD/kernels" "$root/lanner/kernels"; else ln -s "$PWD/.kernels-ab/$ref/kernels" "$root/lanner/kernels"; fi
    (cd benchmarks && PYTHONPATH=$root:$PYTHONPATH timeout 150 python3 peer_bench.py "$mode" "$model" --steps 4 --warmup 2 \
      --same-weights "$@" | tee "${OUT:?}/ab-$which-$i.log" | tail -1 | sed "s/^{/{\"kernels\": \"$which\", /" | tee -a "${OUT:?}/ab.jsonl")
  done
done
