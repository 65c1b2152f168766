# Sourced by the *_round.sh device scripts once they have set `budget` (seconds) and `out` (a folder):
# the peers importable, the time left of the call's budget, and a JSON line of the versions and the GPU.
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
