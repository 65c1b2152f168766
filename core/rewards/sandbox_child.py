"""The sandbox's child: `python -I -B sandbox_child.py <cpu s> <memory MiB> <open files> <file MiB>`,
started by sandbox.py in a fresh temporary directory with an empty environment. It limits itself,
reads one batch as JSON on stdin, runs each reward function (built-in or the user's `reward`) and
writes {"rewards": [[...], ...]} or {"error": {...}} on stdout. Python's audit hooks refuse sockets,
new processes, native libraries and writes outside the working directory: a guard against
accidents, not a security boundary (Python's documentation says so); the hard limits are the
resource limits, the timeout and, where the kernel allows, the network namespace (sandbox.py)."""
import importlib.util
import json
import linecache
import math
import os
import resource
import sys
import traceback

REFUSED = ("socket.", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.kill", "os.killpg")
WRITES = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
          "os.truncate", "shutil.rmtree", "os.utime")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
MARK = "lanner-sandbox: running "


def _limit(cpu_s: int, memory_mib: int, open_files: int, file_mib: int) -> None:
    for name, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_mib * 2**20),
                        (resource.RLIMIT_NOFILE, open_files), (resource.RLIMIT_FSIZE, file_mib * 2**20),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(name, (value, value))


def _inside(path, home: str) -> bool:
    if isinstance(path, int):
        return True  # an open descriptor: opened under these rules
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(home + os.sep)
    except (TypeError, ValueError):
        return False


def _guard(home: str):
    def hook(event: str, args: tuple) -> None:
        if event.startswith(REFUSED):
            raise PermissionError(f"the reward sandbox refuses {event}")
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or bool((flags or 0) & WRITE_FLAGS)
            if writes and not _inside(path, home):
                raise PermissionError(f"the reward sandbox refuses writing {path!r}: only its working directory is writable")
        elif event in WRITES and args and not _inside(args[0], home):
            raise PermissionError(f"the reward sandbox refuses {event} on {args[0]!r}")
    return hook


def _user_function(function: dict, name: str):
    filename = f"<reward {name}>"
    source = function["source"]
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"__name__": "reward_" + name}
    exec(compile(source, filename, "exec"), namespace)
    reward = namespace.get("reward")
    if not callable(reward):
        raise TypeError("the code defines no function named reward(prompts, completions, **columns)")
    return reward


# The largest |reward| a function may return. Weights go to 100 (spec.RewardFunction), so weighted totals and their
# spread, which TRL normalises in float32 (its largest finite value 3.4e38, a square of one 1.8e19), stay far
# inside it: a reward of 1e30 passed the finite check and turned every advantage of its group into NaN or zero.
MAX_ABS_REWARD = 1e6


def _checked(values, count: int) -> list:
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise TypeError(f"reward returned {type(values).__name__}"
                        + (f" of {len(values)} values" if isinstance(values, (list, tuple)) else "")
                        + f"; it must return a list of {count} numbers (or None), one per completion")
    out = []
    for index, value in enumerate(values):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or abs(value) > MAX_ABS_REWARD):
            raise TypeError(f"reward returned {value!r} for completion {index}; rewards are numbers within "
                            f"±{MAX_ABS_REWARD:g} (or None)")
        out.append(None if value is None else float(value))
    return out


def _score_builtin():
    """builtin.score_builtin, loaded from beside this file: `python -I` ignores PYTHONPATH, through
    which some installs (the GPU machine's) find the lanner package."""
    path = os.path.join(os.path.dirname(__file__), "builtin.py")
    spec = importlib.util.spec_from_file_location("lanner_reward_builtin", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.score_builtin


def main() -> int:
    score_builtin = _score_builtin()
    result_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the user's prints go to the log, not into the protocol
    _limit(*(int(value) for value in sys.argv[1:5]))
    batch = json.load(sys.stdin)
    prompts, completions, columns = batch["prompts"], batch["completions"], batch["columns"]
    sys.addaudithook(_guard(os.path.realpath(os.getcwd())))
    rewards = []
    for function in batch["functions"]:
        name = function.get("name") or function["kind"]
        print(MARK + name, file=sys.stderr, flush=True)
        try:
            if function["kind"] == "python":
                values = _user_function(function, name)(prompts, completions, **columns)
            else:
                values = score_builtin(function, completions, columns)
            rewards.append(_checked(values, len(completions)))
        except BaseException as error:  # noqa: BLE001 - every failure of the user's code is reported
            frames = traceback.format_exception(type(error), error, error.__traceback__)
            # The first frames are this file's; the user's start at their own file name.
            user = [frame for frame in frames if __file__ not in frame]
            json.dump({"error": {"function": name, "message": f"{type(error).__name__}: {error}",
                                 "traceback": "".join(user)}}, result_out)
            result_out.flush()
            return 0
    json.dump({"rewards": rewards}, result_out)
    result_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
