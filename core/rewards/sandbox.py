"""Runs a job's reward functions on one batch in a sandboxed subprocess (sandbox_child.py): never
in the calling process, which is the API's (the test route) or the training process's.

What it does: a fresh Python (`-I`: no PYTHONPATH, no user site) in a fresh temporary working
directory, deleted afterwards; an environment of PATH, HOME and LANG only, so no secret of the
parent (database URL, tokens) is inherited; limits on CPU time, address space, open files, the size
of a written file, no core dumps; a wall-clock timeout per batch after which the process group is
killed; a network namespace of its own (no interface but a down loopback) where `unshare --net
--map-root-user` works, checked once per process. docs/rewards.md says what it does not guarantee."""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lanner.core.rewards.sandbox_child import MARK

CHILD = Path(__file__).with_name("sandbox_child.py")
LOG_KEPT = 20_000  # characters of the functions' printed output kept for a failure's message


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 30.0
    memory_mib: int = 1024
    open_files: int = 64
    file_mib: int = 16


class RewardFunctionFailed(Exception):
    """A reward function failed or was stopped; `traceback` is the user's part of it."""

    def __init__(self, function: str | None, message: str, traceback: str = "", output: str = ""):
        self.function, self.message, self.traceback, self.output = function, message, traceback, output
        super().__init__(f"Reward function {function}: {message}" if function else f"Reward functions: {message}")

    def details(self) -> str:
        return "\n".join(part for part in (str(self), self.traceback.rstrip(), self.output.rstrip()) if part)


@functools.cache
def network_isolated() -> bool:
    """Whether the sandbox gets a network namespace of its own on this machine."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        return subprocess.run([unshare, "--net", "--map-root-user", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_reward_functions(functions: list[dict], prompts: list, completions: list[str], columns: dict[str, list],
                         limits: SandboxLimits = SandboxLimits()) -> list[list[float | None]]:
    """Each function's rewards (in order) for the batch; RewardFunctionFailed when one fails."""
    batch = json.dumps({"functions": functions, "prompts": prompts, "completions": completions, "columns": columns})
    prefix = [shutil.which("unshare"), "--net", "--map-root-user"] if network_isolated() else []
    cpu = max(1, int(limits.timeout_s) + 1)
    with tempfile.TemporaryDirectory(prefix="lanner-reward-") as home:
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        with open(Path(home) / ".output", "w+b") as output:
            process = subprocess.Popen(
                [*prefix, sys.executable, "-I", "-B", str(CHILD), str(cpu), str(limits.memory_mib),
                 str(limits.open_files), str(limits.file_mib)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=output, cwd=home, env=env,
                start_new_session=True)
            try:
                stdout, _ = process.communicate(batch.encode(), timeout=limits.timeout_s)
                stopped = None
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
                stdout, stopped = b"", f"stopped after {limits.timeout_s:g} s (the time limit of one batch)"
            output.seek(0)
            printed = output.read().decode(errors="replace")
    running = [line[len(MARK):] for line in printed.splitlines() if line.startswith(MARK)]
    shown = "\n".join(line for line in printed.splitlines() if not line.startswith(MARK))[-LOG_KEPT:]
    function = running[-1] if running else None
    if stopped:
        raise RewardFunctionFailed(function, stopped, output=shown)
    try:
        answer = json.loads(stdout)
    except ValueError:
        how = (f"killed by signal {-process.returncode}" if process.returncode < 0
               else f"exited with code {process.returncode}")
        if process.returncode == -signal.SIGXCPU or process.returncode == -signal.SIGKILL:
            how += " (its CPU time limit)"
        raise RewardFunctionFailed(function, f"the sandbox {how} without an answer", output=shown) from None
    if "error" in answer:
        error = answer["error"]
        raise RewardFunctionFailed(error["function"], error["message"], error["traceback"], shown)
    return answer["rewards"]
