"""Installs llama.cpp (the llama-cpp-python package of the `llama-cpp` extra, which compiles it) into
this environment: `lanner build-llama-cpp`. `./lanner up` starts it in a process of its own, so the
studio answers meanwhile (once per `up`: a failed build is not tried again until the next);
`./lanner test` runs it in the foreground. One lock per environment, also taken by ./lanner around its
own pip runs, keeps two installs from running at once: a build that had to wait keeps the outcome of
the one it waited for instead of trying again. The state file (lanner.inference.availability) tells
the studio and later runs how it stands."""
from __future__ import annotations

import fcntl
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from lanner.core.settings import REPO_ROOT
from lanner.inference.availability import LlamaCppStatus, llama_cpp_status, read_state, write_state

LOCK_FILE = Path(sys.prefix) / ".lanner-pip.lock"  # the name ./lanner locks too
LOG_NAME = "llama-cpp-build.log"
CONSTRAINTS = REPO_ROOT / "constraints.txt"


def requirement() -> str:
    """llama-cpp-python as the `llama-cpp` extra of pyproject.toml asks for it."""
    for entry in metadata.requires("lanner") or []:
        spec, _, marker = entry.partition(";")
        if re.search(r"""extra\s*==\s*["']llama[-_]cpp["']""", marker):
            return spec.strip()
    return "llama-cpp-python"


def install_command() -> list[str]:
    command = [sys.executable, "-m", "pip", "install", "--progress-bar", "off", requirement()]
    return command + ["-c", str(CONSTRAINTS)] if CONSTRAINTS.is_file() else command


def wanted() -> str:
    """What a build installs: the requirement and, when constraints.txt pins it, the pinned version."""
    pins = CONSTRAINTS.read_text() if CONSTRAINTS.is_file() else ""
    pin = re.search(r"^llama[-_]cpp[-_]python\s*==\s*\S+", pins, re.MULTILINE | re.IGNORECASE)
    return requirement() + (f" {pin.group(0)}" if pin else "")


def _is_current() -> bool:
    state = read_state()
    return state.get("state") == "ready" and state.get("wanted") == wanted() and llama_cpp_status().state == "ready"


def build(log: Path, command: list[str] | None = None) -> LlamaCppStatus:
    """Installs llama-cpp-python unless it is installed as wanted; its output goes to `log`. Waits for
    a build under way and keeps its outcome. Returns the status it leaves."""
    command = command or install_command()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK_FILE, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            print(f"Waiting for another install into {sys.prefix} to finish", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
            waited = True
        if _is_current() or (waited and read_state().get("state") == "failed"):
            return llama_cpp_status()
        write_state("building", log=log, wanted=wanted())
        print(f"Building llama.cpp (llama-cpp-python compiles it, a few minutes); log: {log}", flush=True)
        with open(log, "ab") as out:
            out.write(f"\n$ {' '.join(command)}\n".encode())
            out.flush()
            code = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT).returncode
        write_state("ready" if code == 0 else "failed", log=log, wanted=wanted())
    return llama_cpp_status()


def say_status(status: LlamaCppStatus) -> str:
    """One line for a terminal."""
    uses = "GGUF k-quants, the GGUF checks of an export and CPU chat"
    if status.state == "ready":
        return f"llama.cpp is ready: {uses} are available."
    log = f" Log: {status.log}" if status.log else ""
    if status.state == "building":
        return f"llama.cpp is being built in the background; {uses} become available when it is done.{log}"
    return f"{status.detail}{log}"
