# Sourced by the *_round.sh device scripts once they have set `budget` (seconds) and `out` (a folder):
# the peers importable, the time left of the call's budget, a JSON line of the versions and the GPU, and
# the steps they share (run from benchmarks/): one run.py process, the random weights saved, a skip, a bound
# matched to a peer's peak.
start=$SECONDS
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.peers/site:${PYTHONPATH:-}
left() { echo $(( budget - (SECONDS - start) )); }
versions() {  # versions PACKAGE...: appended to $out/results.jsonl
  python3 - "$@" <<'PY' | tee -a "$out/results.jsonl"
import importlib.metadata as m, json, sys, torch
def version(p):
    try:
        return m.version(p)
    except Exception as e:
        return repr(e)
print(json.dumps({"versions": {p: version(p) for p in sys.argv[1:]},
                  "gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability()}))
PY
}
skip() { echo "skipped (only $(left) s left): $*"; echo "{\"skipped\": \"$*\"}" >> "$out/results.jsonl"; }
one() {  # one TIMEOUT RUN.PY-ARGS...: one run.py process (4 timed steps after 2, same weights), capped by the time left
  local t=$1; shift; local l; l=$(( $(left) - 5 )); (( l < t )) && t=$l
  (( t < 40 )) && { skip "$*"; return; }
  echo "=== $(date -u +%T) run.py $* --timeout $t ($(left) s left)"
  BENCH_STACKS_AFTER=$(( t - 8 )) python3 run.py "$@" --steps 4 --warmup 2 --same-weights --stream --timeout "$t" --out "$out/results.jsonl"
}
save_weights() {  # save_weights MODEL [MIN_LEFT]: the random weights the Unsloth and 4-bit loaders read, once, timed
  (( $(left) < ${2:-60} )) && { skip "save $1"; return; }
  echo "=== $(date -u +%T) saving the random weights of $1 ($(left) s left)"; local t0=$SECONDS
  timeout 240 python3 -c "import peer_bench, json; print(json.dumps(dict(saved=peer_bench.saved_dir('$1'))))" \
    && echo "{\"saved_weights_s\": $(( SECONDS - t0 )), \"model\": \"$1\"}" | tee -a "$out/results.jsonl" \
    && du -sh "/tmp/rand-$1"
}
peak_times() {  # peak_times MODE MODEL SEQ BS FORMAT FACTOR...: FORMAT filled with each FACTOR x the peak GiB of MODE's
  # last row for MODEL at SEQ x BS in $out/results.jsonl (a bound matched to a peer's measured peak); empty without one
  python3 - "$out/results.jsonl" "$@" <<'PY'
import json, sys
path, mode, model, seq, bs, form, *factors = sys.argv[1:]
rows = [json.loads(line) for line in open(path) if line.startswith("{")]
peaks = [r["peak_gib"] for r in rows if r.get("mode") == mode and "peak_gib" in r
         and (r.get("model"), r.get("seq"), r.get("bs")) == (model, int(seq), int(bs))]
print(form % tuple(float(f) * peaks[-1] for f in factors) if peaks else "")
PY
}
