"""llama.cpp's build (lanner build-llama-cpp, which ./lanner up starts in the background): its outcome in
words, one build at a time per environment, and ./lanner's own installs under the same lock."""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lanner.cli import llama_cpp_build
from lanner.inference import availability
from lanner.inference.availability import llama_cpp_status, read_state

from support import REPO

FAIL = [sys.executable, "-c", "print('cmake: command not found'); raise SystemExit(1)"]


@pytest.fixture
def environment(tmp_path, monkeypatch, llama_cpp_state) -> Path:
    """The state file and the lock of a build, in a folder of the test's own."""
    monkeypatch.setattr(llama_cpp_build, "LOCK_FILE", tmp_path / "pip.lock")
    return tmp_path


def test_a_failed_build_says_so_with_its_log_and_is_not_tried_by_one_that_waited_for_it(environment):
    log = environment / "logs" / "llama-cpp-build.log"
    status = llama_cpp_build.build(log, FAIL)
    assert status.state == "failed" and status.log == str(log)
    assert "llama.cpp's build failed at " in status.detail and "./lanner build-llama-cpp" in status.detail
    assert "cmake: command not found" in log.read_text()
    assert "Log: " + str(log) in llama_cpp_build.say_status(status)

    # Another build (a second `up`, or `./lanner test`) waits for the one under way and keeps its outcome.
    marker = environment / "built-again"
    script = (f"import sys; from lanner.cli import llama_cpp_build as b; from lanner.inference import availability as a\n"
              f"from pathlib import Path\n"
              f"b.LOCK_FILE, a.STATE_FILE = Path({str(llama_cpp_build.LOCK_FILE)!r}), Path({str(availability.STATE_FILE)!r})\n"
              f"print(b.build(Path({str(log)!r}), ['touch', {str(marker)!r}]).state, flush=True)\n")
    with open(llama_cpp_build.LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        waiting = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=environment)
        assert waiting.stdout.readline().startswith("Waiting for another install into ")
    assert waiting.communicate(timeout=60)[0].strip() == "failed" and not marker.exists()

    assert llama_cpp_build.build(log, ["touch", str(marker)]).state == "ready" and marker.exists()  # a later run tries
    assert read_state()["wanted"] == llama_cpp_build.wanted()


def test_a_build_that_stopped_half_way_is_reported_as_failed(environment):
    gone = subprocess.Popen(["true"])
    gone.wait()
    availability.STATE_FILE.write_text(f"state=building\nsince=2026-12-02T11:20:00+00:00\npid={gone.pid}\n")
    status = llama_cpp_status()
    assert status.state == "failed" and "stopped before it finished at 11:20 UTC" in status.detail


def test_an_install_by_lanner_waits_for_the_one_under_way_and_does_not_repeat_it(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    for tool in ("python", "pip", "lanner"):
        (venv / "bin" / tool).write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {calls}\n")
        (venv / "bin" / tool).chmod(0o755)
    inputs = b"".join((REPO / name).read_bytes() for name in ("pyproject.toml", "setup.py", "constraints.txt"))
    env = {**os.environ, "LANNER_VENV": str(venv), "PYTHON": sys.executable}
    with open(venv / ".lanner-pip.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        command = subprocess.Popen([str(REPO / "lanner"), "migrate"], env=env, stdout=subprocess.PIPE, text=True)
        assert "Waiting for another install into" in command.stdout.readline()
        (venv / ".lanner-installed").write_text(hashlib.sha256(inputs).hexdigest()[:16] + "\n")
    command.communicate(timeout=60)
    assert command.returncode == 0 and calls.read_text() == "lanner migrate\n"
