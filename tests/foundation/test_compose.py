"""docker-compose.yml is a valid file for a GPU box; Debian's docker-compose checks it without an engine."""
from __future__ import annotations

import os
import shutil
import subprocess

import yaml

from support import REPO


def compose_config(*options: str, env: dict | None = None) -> dict:
    assert shutil.which("docker-compose"), "docker-compose is needed (Debian: apt-get install docker-compose)"
    result = subprocess.run(["docker-compose", "-f", "docker-compose.yml", *options, "config"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, env=env)
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


def test_the_worker_profile_runs_only_workers_against_the_studios_database_and_redis():
    env = {**os.environ, "LANNER_DATABASE_URL": "postgresql+psycopg://lanner:secret@studio:5432/lanner",
           "LANNER_REDIS_URL": "redis://studio:6379/0", "LANNER_HOST_NAME": "box2", "LANNER_STORE": "s3",
           "LANNER_S3_BUCKET": "lanner-team"}
    host = compose_config("--profile", "worker", env=env)["services"]["worker-host"]
    assert host["profiles"] == ["worker"] and host["command"] == ["lanner", "worker"]
    assert host["hostname"] == "box2" and "depends_on" not in host  # no database or Redis of its own
    assert host["environment"]["LANNER_DATABASE_URL"] == env["LANNER_DATABASE_URL"]
    assert host["environment"]["LANNER_REDIS_URL"] == env["LANNER_REDIS_URL"]
    assert (host["environment"]["LANNER_STORE"], host["environment"]["LANNER_S3_BUCKET"]) == ("s3", "lanner-team")
    assert host["deploy"]["resources"]["reservations"]["devices"][0]["count"] == "all"
