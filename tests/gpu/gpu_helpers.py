"""A client of a running studio as the browser uses it (HTTP API and WebSockets, with an API token),
and the GPU's own view (NVML) for the tests of tests/gpu."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The Llama-3 8B shape: the one the kernels' benchmarks use (benchmarks/peer_bench.py's llama-8b).
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0,
                 max_position_embeddings=8192, rms_norm_eps=1e-5)
PASSWORD = "gpu-tests-password-1"
TERMINAL = ("succeeded", "failed", "cancelled")
WORDS = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches "
         "under bright northern lights and distant rivers carry old songs toward the sea").split()


def long_rows(count: int, words: int = 2600) -> list[dict]:
    """Rows longer than 2,048 tokens, so every sequence of a batch is cut to max_seq_len (no padding)."""
    return [{"instruction": f"Write passage {i}.", "output": " ".join(WORDS[(i + j) % len(WORDS)] for j in range(words))}
            for i in range(count)]


class ApiError(AssertionError):
    def __init__(self, status: int, body: Any):
        super().__init__(f"{status}: {body}")
        self.status, self.body = status, body


@dataclass
class StudioClient:
    url: str
    token: str = ""

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None, timeout: float = 60) -> Any:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Origin": self.url}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                content = response.read()
                return json.loads(content) if content else None
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                raise ApiError(error.code, json.loads(text)) from None
            except ValueError:
                raise ApiError(error.code, text) from None

    @classmethod
    def signed_up(cls, url: str) -> "StudioClient":
        """The studio's first user (an admin), signed in with an API token."""
        request = urllib.request.Request(
            f"{url}/api/setup", method="POST", headers={"Content-Type": "application/json", "Origin": url},
            data=json.dumps({"email": "gpu@example.com", "display_name": "GPU", "password": PASSWORD}).encode())
        with urllib.request.urlopen(request, timeout=30) as response:
            cookie = response.headers["Set-Cookie"].split(";")[0]
        request = urllib.request.Request(
            f"{url}/api/tokens", method="POST", data=json.dumps({"name": "gpu tests"}).encode(),
            headers={"Content-Type": "application/json", "Origin": url, "Cookie": cookie})
        with urllib.request.urlopen(request, timeout=30) as response:
            return cls(url, json.load(response)["token"])

    def upload(self, name: str, rows: list[dict]) -> int:
        body = "".join(json.dumps(row) + "\n" for row in rows).encode()
        return self.request("POST", f"/api/datasets?filename={name}", raw=body)["id"]

    def job(self, job_id: int) -> dict:
        return self.request("GET", f"/api/jobs/{job_id}")

    def wait(self, job_id: int, timeout: float, until=lambda job: job["status"] in TERMINAL) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if until(job):
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} did not get there in {timeout:.0f} s: {job}\n"
                                     + "\n".join(self.logs(job_id)[-30:]))
            time.sleep(0.5)

    def events(self, job_id: int, timeout: float = 10) -> list[dict]:
        """Every event of the job's stream so far, replayed over its WebSocket as the job page reads it."""
        from websockets.sync.client import connect

        ws_url = self.url.replace("http://", "ws://") + f"/ws/jobs/{job_id}?after=0-0&token={self.token}"
        events = []
        with connect(ws_url, open_timeout=timeout) as socket:
            while True:
                try:
                    events.append(json.loads(socket.recv(timeout=2)))
                except TimeoutError:  # the replay is over and nothing new came
                    return events

    def logs(self, job_id: int) -> list[str]:
        try:
            return [event["data"]["message"] for event in self.events(job_id) if event["type"] == "log"]
        except Exception as error:  # a log for a failure message must not hide the failure
            return [f"(no logs: {error!r})"]

    def of_type(self, job_id: int, kind: str) -> list[dict]:
        return [event["data"] for event in self.events(job_id) if event["type"] == kind]


def gpu_memory_used_bytes(index: int = 0) -> int:
    import pynvml

    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)


def saved_llama3_8b(target: Path, tokenizer_dir: Path | str) -> Path:
    """Random bf16 weights of the Llama-3 8B shape saved at `target` (once) with a tokenizer whose ids
    fit its vocabulary. The folder appears whole (renamed from a partial one), so its presence says it is
    complete, however many shards it holds."""
    if target.exists():
        return target
    import shutil

    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**LLAMA3_8B, torch_dtype="bfloat16")).to(torch.bfloat16)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    del model
    torch.cuda.empty_cache()
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(partial)
    partial.rename(target)
    return target
