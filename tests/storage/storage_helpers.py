"""What the storage tests share: a local S3-compatible server (moto's server mode, docs/storage.md says
why), a TCP path to it the tests can cut and restore (the store "unreachable for a while", its objects
kept, as a real store's are across an outage), and worker "hosts": separate data and cache directories
on one database, one Redis and one store."""
from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from support import free_port

_spec = importlib.util.spec_from_file_location(
    "lanner_worker_test_helpers", Path(__file__).resolve().parents[1] / "worker" / "worker_helpers.py")
worker_helpers = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
if not hasattr(worker_helpers, "Studio"):
    _spec.loader.exec_module(worker_helpers)

ACCESS = {"LANNER_S3_ACCESS_KEY_ID": "testing", "LANNER_S3_SECRET_ACCESS_KEY": "testing",
          "LANNER_S3_REGION": "us-east-1"}


class MotoServer:
    """`python -m moto.server` on a free localhost port: S3's API (multipart, ranges) in memory."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        with open(log, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                             str(self.port)], stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                assert self.process.poll() is None, log.read_text()
                time.sleep(0.1)
        raise AssertionError(f"moto's server did not start:\n{log.read_text()}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class CuttableLink:
    """A TCP proxy on its own port in front of the store: cut() closes it (connections refused, those
    open reset), restore() listens again on the same port."""

    def __init__(self, target_port: int):
        self.target_port, self.port = target_port, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        try:
            listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(), which a close alone would not
        except OSError:
            pass
        listener.close()
        with self._lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            self._open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            with self._lock:
                self._open -= {source, sink}


def new_bucket(endpoint: str) -> str:
    import boto3

    name = f"lanner-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=name)
    return name


def s3_settings(data_dir: Path, endpoint: str, bucket: str, **changes):
    from lanner.core.settings import Settings

    return Settings(data_dir=data_dir, store="s3", s3_bucket=bucket, s3_endpoint_url=endpoint, s3_prefix="team",
                    s3_access_key_id="testing", s3_secret_access_key="testing", s3_region="us-east-1", **changes)


@dataclass
class Host(worker_helpers.Studio):
    """A worker host: its own data dir and cache, the shared database, Redis and S3 store."""
    store_env: dict = field(default_factory=dict)

    @property
    def env(self) -> dict:
        return {**super().env, **self.store_env}
