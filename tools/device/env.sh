# Source on the lent GPU machine, from the repository's root, with the parts of .device/ carried
# (docs/device-runs.md):   source tools/device/env.sh
# Unpacks what was carried into /tmp/lanner-device (once per machine: a part carried by an earlier
# call of the same lease stays there), then sets the environment under which `lanner up`, the
# worker and pytest find the studio's packages, redis-server, the web UI and the built-in model.
LANNER_DEVICE=/tmp/lanner-device
mkdir -p "$LANNER_DEVICE"/{bin,ns/lanner}
_unpack() {  # _unpack ARCHIVE DEST: each version of it once per machine (tar through Python: the image may lack xz)
  [ -f "$1" ] || return 0
  local done="$LANNER_DEVICE/.$(basename "$1")-$(cksum < "$1" | cut -d' ' -f1)"
  [ -f "$done" ] && return 0
  mkdir -p "$2" && python3 -m tarfile -e "$1" "$2" && touch "$done"
}
[ -f .device/site.tar.xz.0 ] && cat .device/site.tar.xz.* > "$LANNER_DEVICE/site.tar.xz"
_unpack "$LANNER_DEVICE/site.tar.xz" "$LANNER_DEVICE/site"
_unpack .device/llama_cpp.tar.xz "$LANNER_DEVICE/site"
_unpack .device/redis.tar.xz "$LANNER_DEVICE/redis"
_unpack .device/ui.tar.xz frontend/dist  # the web UI where `up` serves it by default
_unpack .device/tokenizer.tar.xz "$LANNER_DEVICE/tokenizer"
# The built-in model comes in parts carried by several calls: each is kept until the whole is here.
for part in .device/smollm2.tar.* .device/smollm2.sha256; do
  [ -e "$part" ] && [ ! -e "$LANNER_DEVICE/$(basename "$part")" ] && cp "$part" "$LANNER_DEVICE/"
done
if [ ! -f "$LANNER_DEVICE/.smollm2-done" ] && [ -f "$LANNER_DEVICE/smollm2.sha256" ] \
   && [ "$(cat "$LANNER_DEVICE"/smollm2.tar.* | sha256sum | cut -d' ' -f1)" = "$(cat "$LANNER_DEVICE/smollm2.sha256")" ]; then
  cat "$LANNER_DEVICE"/smollm2.tar.* | tar -C "$LANNER_DEVICE/site" -xf - && touch "$LANNER_DEVICE/.smollm2-done" \
    && rm "$LANNER_DEVICE"/smollm2.tar.*
fi
echo "tools/device/env.sh: built-in model $([ -f "$LANNER_DEVICE/.smollm2-done" ] && echo ready || echo "not complete: $(ls "$LANNER_DEVICE" | grep -c '^smollm2.tar') parts here")"

# lanner.core, lanner.backend ... are the checkout's folders (setup.py maps them so).
for top in core backend worker inference kernels cli; do ln -sfn "$PWD/$top" "$LANNER_DEVICE/ns/lanner/$top"; done
# redis-server with its own libraries, kept out of Python's way.
cat > "$LANNER_DEVICE/bin/redis-server" <<EOF
#!/bin/sh
LD_LIBRARY_PATH=$LANNER_DEVICE/redis/lib exec $LANNER_DEVICE/redis/bin/redis-server "\$@"
EOF
printf '#!%s\nfrom lanner.cli.main import main\nmain()\n' "$(command -v python3)" > "$LANNER_DEVICE/bin/lanner"
chmod +x "$LANNER_DEVICE/bin/redis-server" "$LANNER_DEVICE/bin/lanner"

export PYTHONPATH="$LANNER_DEVICE/ns:$LANNER_DEVICE/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$LANNER_DEVICE/bin:$PATH"
export LANNER_TEST_BIN="$LANNER_DEVICE/bin/lanner" LANNER_TEST_TOKENIZER_DIR="$LANNER_DEVICE/tokenizer"
export LANNER_DATA_DIR=${LANNER_DATA_DIR:-/tmp/lanner-data} LANNER_TEST_CACHE=${LANNER_TEST_CACHE:-/tmp/lanner-test-cache}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
