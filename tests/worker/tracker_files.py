"""Reading back what the trackers wrote: a real MLflow server on localhost (started once per session),
TensorBoard's own reader, and W&B's offline run file."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from support import free_port

# `./lanner test` installs the MLflow server into a virtualenv of its own, beside the tests' (its pins
# conflict with ours; the studio itself needs only the client, mlflow-skinny).
MLFLOW_SERVER = Path(os.environ.get("LANNER_TEST_MLFLOW", Path(sys.prefix) / "mlflow-server" / "bin" / "mlflow"))


class MlflowServer:
    def __init__(self, folder: Path):
        assert MLFLOW_SERVER.exists(), f"no MLflow server at {MLFLOW_SERVER}: `./lanner test` installs it"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = folder / "mlflow-server.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [str(MLFLOW_SERVER), "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
                 "--default-artifact-root", str(folder / "artifacts"), "--host", "127.0.0.1",
                 "--port", self.url.rsplit(":", 1)[1], "--workers", "1"],
                cwd=folder, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout: float = 90) -> "MlflowServer":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"the MLflow server did not answer:\n{self.log.read_text()[-3000:]}")

    def api(self, path: str, body: dict | None = None) -> dict:
        request = urllib.request.Request(f"{self.url}/api/2.0/mlflow/{path}", method="POST" if body else "GET",
                                         data=json.dumps(body).encode() if body else None,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        os.killpg(self.process.pid, 15)
        try:
            self.process.wait(3)  # nothing of it is kept: no need to wait for its workers to finish
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()


class SlowProxy(ThreadingHTTPServer):
    """An HTTP proxy on localhost in front of `target` that holds each request `delay` seconds before
    passing it on: a slow tracking server, or a slow network to it."""

    def __init__(self, target: str, delay: float = 0.0):
        self.delay = delay

        class Handler(BaseHTTPRequestHandler):
            def _forward(handler):
                time.sleep(self.delay)
                length = int(handler.headers.get("Content-Length") or 0)
                request = urllib.request.Request(target + handler.path, method=handler.command,
                                                 data=handler.rfile.read(length) if length else None,
                                                 headers={"Content-Type": handler.headers.get("Content-Type", "")})
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        status, body = answer.status, answer.read()
                except urllib.error.HTTPError as error:
                    status, body = error.code, error.read()
                handler.send_response(status)
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            do_GET = do_POST = do_PATCH = do_DELETE = _forward

            def log_message(handler, *_):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_records(run_file: Path) -> list:
    """The records of a W&B run file (`run-<id>.wandb`): a 7-byte header (":W&B", a magic number, a
    version), then LevelDB's log format: 32 KiB blocks of chunks (CRC-32C, length, type, data), a
    record in one chunk (type 1) or split over first/middle/last chunks (2, 3, 4)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    records, pending, offset, block = [], b"", 7, 32768
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a chunk header is padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack_from("<IHB", data, offset)
        chunk, offset = data[offset + 7:offset + 7 + length], offset + 7 + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_file: Path) -> list[dict]:
    return [{"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            for record in wandb_records(run_file) if record.WhichOneof("record_type") == "history"]
