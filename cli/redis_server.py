"""Find the Redis that LANNER_REDIS_URL names, or start a local one when nothing answers there."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

from redis import Redis
from redis.exceptions import RedisError

LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", ""}


class RedisUnavailable(SystemExit):
    pass


def answers(url: str) -> bool:
    try:
        return bool(Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2).ping())
    except RedisError:
        return False


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        print("No redis-server here: installing Debian's redis-server package…", flush=True)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], check=False, env=env, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], check=False, env=env,
                       stdout=subprocess.DEVNULL)
        found = shutil.which("redis-server") or (Path("/usr/bin/redis-server").is_file() and "/usr/bin/redis-server")
        if found:
            return found
    raise RedisUnavailable(
        "Lanner needs Redis: nothing answers at LANNER_REDIS_URL and there is no redis-server to start, "
        "so install one (Debian/Ubuntu: `sudo apt-get install redis-server`, macOS: `brew install redis`) "
        "or point LANNER_REDIS_URL at a running Redis."
    )


def start_local_redis(url: str, data_dir: Path, log_file: Path) -> subprocess.Popen:
    parsed = urlparse(url)
    if parsed.hostname not in LOCAL_HOSTS:
        raise RedisUnavailable(f"Nothing answers at LANNER_REDIS_URL={url}, and it is not on this machine.")
    port = parsed.port or 6379
    binary = redis_server_binary()
    data_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir),
         "--save", "60 1", "--appendonly", "no", "--daemonize", "no", "--logfile", str(log_file)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if answers(url):
            return process
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise RedisUnavailable(f"redis-server did not start on port {port}; its log is {log_file}.")
