"""docker-compose.yml is a valid file for a GPU box; Debian's docker-compose checks it without an engine."""
from __future__ import annotations

import shutil
import subprocess

import yaml

from support import REPO


def compose_config() -> dict:
    assert shutil.which("docker-compose"), "docker-compose is needed (Debian: apt-get install docker-compose)"
    result = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_file_validates():
    result = subprocess.run(["docker-compose", "-f", "docker-compose.yml", "config", "-q"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_compose_has_the_studio_services():
    services = compose_config()["services"]
    assert {"redis", "postgres", "api", "worker"} <= set(services)
    assert services["api"]["environment"]["LANNER_DATABASE_URL"].startswith("postgresql")
    devices = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["count"] == "all"
    assert services["worker"]["command"][-2:] == ["--gpu", "claim"]
    assert any("/data" in str(volume) for volume in services["worker"]["volumes"])
