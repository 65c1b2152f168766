"""Uploads that fail half-way, on the API served by uvicorn in a process of its own (as `lanner api`
runs it): a client that drops the connection mid-body, and a disk that fills up mid-file. Either
way nothing is left behind and the API goes on serving."""
from __future__ import annotations

import json
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from redis import Redis

from support import free_port, process_env

from backend_helpers import BACKEND_REDIS_URL, CHAT_ROWS, PASSWORD

pytestmark = pytest.mark.timeout(120)
ROW = b'{"text": "a line of text to learn from"}\n'
FILE_SIZE_LIMIT = 512 * 1024


class ServedApi:
    def __init__(self, tmp_path: Path, database: Path, file_size_limit: int):
        self.data_dir = tmp_path / "data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = process_env()
        env.update(LANNER_DATA_DIR=str(self.data_dir), LANNER_DATABASE_URL=f"sqlite:///{database}",
                   LANNER_REDIS_URL=BACKEND_REDIS_URL, LANNER_HUB_URL="http://127.0.0.1:9", LANNER_MIN_FREE_BYTES="0",
                   PYTHONDONTWRITEBYTECODE="1")

        def limit_file_sizes():  # what a full disk does to a write, without needing a full disk
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

        self.log = open(tmp_path / "api.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "lanner.backend.app:create_app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT,
            preexec_fn=limit_file_sizes)
        self._wait_up()
        created = self.request("POST", "/api/setup", json.dumps(
            {"email": "ada@example.com", "display_name": "Ada", "password": PASSWORD}).encode(),
            {"Content-Type": "application/json"}, cookie=False)
        assert created[0] == 201, created
        self.cookie = created[2]["Set-Cookie"].split(";")[0]

    def _wait_up(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.data_dir.parent / "api.log").read_text()
            try:
                urllib.request.urlopen(f"{self.url}/api/setup", timeout=2).close()
                return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("the API did not come up")

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                cookie: bool = True):
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method, headers=dict(headers or {}))
        if cookie:
            request.add_header("Cookie", self.cookie)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null"), response.headers
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null"), exc.headers

    def upload(self, name: str, content: bytes):
        return self.request("POST", f"/api/datasets?filename={name}", content,
                            {"Content-Type": "application/octet-stream"})

    def incoming(self) -> list[Path]:
        folder = self.data_dir / "datasets" / ".incoming"
        return list(folder.iterdir()) if folder.exists() else []

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory, migrated_sqlite):
    """One server for the module (starting one takes seconds): its files may not grow past 512 KiB."""
    Redis.from_url(BACKEND_REDIS_URL).flushdb()
    tmp_path = tmp_path_factory.mktemp("served")
    database = tmp_path / "lanner.db"
    shutil.copy(migrated_sqlite, database)
    served = ServedApi(tmp_path, database, file_size_limit=FILE_SIZE_LIMIT)
    yield served
    served.stop()


def until(condition, what: str, seconds: float = 30):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting: {what}")


def test_a_client_that_drops_the_connection_mid_upload_leaves_nothing(api):
    announced = len(ROW) * 100_000
    with socket.create_connection(("127.0.0.1", api.port)) as sock:
        sock.sendall((f"POST /api/datasets?filename=big.jsonl HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {api.cookie}\r\n"
                      f"Content-Type: application/octet-stream\r\nContent-Length: {announced}\r\n\r\n").encode())
        sock.sendall(ROW * 5_000)  # 200 kB: less than the file size limit
        until(lambda: any(path.stat().st_size > 0 for path in api.incoming()), "the upload to reach the disk")
    until(lambda: api.incoming() == [], "the half-uploaded file to be removed")
    status, page, _ = api.request("GET", "/api/datasets")
    assert status == 200 and page["total"] == 0
    assert not [path for path in (api.data_dir / "datasets").iterdir() if path.name != ".incoming"]
    assert api.upload("small.jsonl", CHAT_ROWS.encode())[0] == 201  # and the API serves on
    api.request("DELETE", "/api/datasets/1")


def test_a_disk_that_fills_up_mid_upload_is_a_507_and_leaves_nothing(api):
    status, body, _ = api.upload("big.jsonl", ROW * 30_000)  # about 1.2 MB: more than fits
    assert status == 507 and "disk is full" in body["detail"], body
    assert api.incoming() == []
    status, page, _ = api.request("GET", "/api/datasets")
    assert status == 200 and page["total"] == 0
    assert api.upload("small.jsonl", CHAT_ROWS.encode())[0] == 201
