#!/usr/bin/env bash
# The FP8 fidelity run (benchmarks/fp8_fidelity.py) on the device without the whole studio bundle: the built-in
# SmolLM2's GGUF (94 MiB, more than a call carries beside the checkout) in parts over the calls of one warm lease,
# with the gguf package that transformers converts it with (docs/fp8.md, "Benchmarks").
#   here:        bash benchmarks/fidelity_parts.sh split [FIRST_MIB]   # -> .fidelity/0 (the package, a checksum and
#                the first FIRST_MIB of the file, 14 by default: room beside .peers), .fidelity/1, 2, ... (40 MiB each)
#   the device:  bash benchmarks/fidelity_parts.sh take N              # one call each, carrying .fidelity/N
#                OUT=$OUT bash benchmarks/fidelity_parts.sh run [fp8_fidelity.py options]
#                (run takes what the call carries too, then joins and checks the parts, converts the GGUF as
#                core/default_model.py does, and writes $OUT/fp8_fidelity.json)
# The parts wait in /tmp/fidelity between calls (the machine keeps /tmp while the lease stays warm).
set -euo pipefail
cd "$(dirname "$0")/.."
action=${1:?split, take or run}
kept=/tmp/fidelity
gguf_name=SmolLM2-135M-Instruct.Q4_1.gguf
take() {  # the parts this call carries, into $kept
  mkdir -p "$kept"
  for dir in .fidelity/*/; do
    [[ -d $dir ]] && cp -r "$dir". "$kept/"
  done
  ls "$kept"
}
case $action in
split)
  first=${2:-14}
  source=$(.venv/bin/python -c "from lanner.core.default_model import gguf_path; print(gguf_path())")
  site=$(.venv/bin/python -c "import gguf, pathlib; print(pathlib.Path(gguf.__file__).parents[1])")
  rm -rf .fidelity && mkdir -p .fidelity/0/site
  cp -r "$site/gguf" "$site"/gguf-*.dist-info .fidelity/0/site/  # transformers reads the package's version record
  find .fidelity/0/site -name __pycache__ -prune -exec rm -rf {} +
  sha256sum "$source" | cut -d' ' -f1 > .fidelity/0/sha256
  head -c $(( first * 1024 * 1024 )) "$source" > .fidelity/0/part.0
  tail -c +$(( first * 1024 * 1024 + 1 )) "$source" | split -b 40M -d -a 1 - .fidelity/rest.
  n=1
  for rest in .fidelity/rest.*; do
    mkdir -p ".fidelity/$n" && mv "$rest" ".fidelity/$n/part.$n"; n=$(( n + 1 ))
  done
  grep -qx '/.fidelity/' .git/info/exclude 2>/dev/null || echo '/.fidelity/' >> .git/info/exclude
  du -sh .fidelity/*; echo "carry .fidelity/0 (with .peers and the rest of a call), then .fidelity/1 ... in the calls after it" ;;
take)
  take ;;
run)
  shift
  take > /dev/null
  mapfile -t parts < <(ls "$kept"/part.* | sort -t. -k2 -n)
  cat "${parts[@]}" > "$kept/$gguf_name"
  echo "$(cat "$kept/sha256")  $kept/$gguf_name" | sha256sum -c --quiet || { echo "a part is missing (${#parts[@]} here)" >&2; exit 3; }
  root=$(mktemp -d); mkdir "$root/lanner"; ln -s "$PWD/kernels" "$root/lanner/kernels"
  export PYTHONPATH=$root:$kept/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
  [[ -f $kept/model/config.json ]] || python3 -P - "$kept" "$gguf_name" <<'PY'
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
folder, name = sys.argv[1:]
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
model.hf_quantizer, model.is_quantized = None, False  # dequantised at load (as core/default_model.py leaves it)
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(f"{folder}/model")
tokenizer.save_pretrained(f"{folder}/model")
PY
  python3 -P benchmarks/fp8_fidelity.py --model "$kept/model" --out "${OUT:?}/fp8_fidelity.json" "$@" | tail -c 600 ;;
*)
  echo "split, take or run" >&2; exit 2 ;;
esac
