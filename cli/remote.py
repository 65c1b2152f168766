"""`lanner submit` and `lanner export`: a job queued on a running studio with an API token, its event
stream followed (WebSocket /ws/jobs/{id}) until the job ends. Exit code 0: succeeded; 1: failed or
refused (the reason printed); 3: cancelled."""
from __future__ import annotations

import json
from urllib.parse import quote
from pathlib import Path
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from lanner.cli.terminal import EventPrinter, read_spec

EXIT_FAILED, EXIT_CANCELLED = 1, 3
ENDED = {"succeeded": 0, "failed": EXIT_FAILED, "cancelled": EXIT_CANCELLED}


class Studio:
    def __init__(self, url: str, token: str | None):
        if not token:
            raise SystemExit("An API token is needed: --token TOKEN or LANNER_TOKEN (the studio's account menu "
                             "creates one)")
        self.url, self.token = url.rstrip("/"), token
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    def call(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as error:
            raise SystemExit(f"The studio at {self.url} did not answer: {error}") from None
        if response.is_success:
            return response.json()
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text[:500]
        if isinstance(detail, list):  # a 422: one entry per field
            detail = "\n".join(f"  {'.'.join(str(p) for p in item.get('loc', [])[1:])}: {item.get('msg')}"
                               for item in detail)
        raise SystemExit(f"The studio refused {method} {path} ({response.status_code}):\n{detail}")

    def follow(self, job: dict) -> int:
        """Prints the job's events until it ends; its exit code."""
        print(f"Job {job['id']} ({job['name']}) is {job['status']}: {self.url}/jobs/{job['id']}", flush=True)
        ws_url = self.url.replace("http", "ws", 1) + f"/ws/jobs/{job['id']}?token={quote(self.token, safe='')}"
        printer = EventPrinter()
        status = job["status"]
        try:
            with connect(ws_url, open_timeout=30, max_size=2**24) as socket:
                for message in socket:
                    event = json.loads(message)
                    printer.show(event["type"], event["data"])
                    if event["type"] == "status" and event["data"]["status"] in ENDED:
                        status = event["data"]["status"]
                        break
        except (OSError, ConnectionClosed) as error:
            printer.line(f"The event stream closed ({error}); asking for the job's status")
        finally:
            printer.close()
        if status not in ENDED:  # the stream went away before the end
            status = self.call("GET", f"/api/jobs/{job['id']}")["status"]
        ended = self.call("GET", f"/api/jobs/{job['id']}")
        if status == "succeeded":
            print(f"Job {job['id']} succeeded" + (f" ({ended['error']})" if ended.get("error") else ""))
        elif status in ENDED:
            print(f"Job {job['id']} {status}" + (f": {ended['error']}" if ended.get("error") else ""))
        else:
            print(f"Job {job['id']} is {status}; follow it on {self.url}/jobs/{job['id']}")
        return ENDED.get(status, EXIT_FAILED)


def submit(config: Path, url: str, token: str | None, dataset: Path | None, dataset_id: int | None) -> int:
    studio = Studio(url, token)
    if dataset is not None:
        if not dataset.is_file():
            raise SystemExit(f"--dataset {dataset}: no such file")
        read_spec(config, dataset_id=1)  # the file's errors, before the upload
        with dataset.open("rb") as body:
            uploaded = studio.call("POST", "/api/datasets", params={"filename": dataset.name}, content=body,
                                   headers={"Content-Type": "application/octet-stream"})
        print(f"Uploaded {dataset.name} as dataset {uploaded['id']}")
        dataset_id = uploaded["id"]
    spec = read_spec(config, dataset_id)
    if "dataset_id" not in spec:
        raise SystemExit(f"{config} names no dataset_id: give --dataset FILE or --dataset-id N")
    return studio.follow(studio.call("POST", "/api/jobs", json=spec))


def export_options(args) -> dict[str, Any]:
    """The export body of `lanner export`'s flags: only what they change; the studio's defaults otherwise."""
    options: dict[str, Any] = {key: False for key, off in (("adapter", args.no_adapter), ("merged", args.no_merged),
                                                           ("verify", args.no_verify)) if off}
    if args.no_gguf or args.gguf:
        options["gguf_types"] = [] if args.no_gguf else args.gguf
    return options


def export(job_id: int, url: str, token: str | None, options: dict[str, Any]) -> int:
    studio = Studio(url, token)
    return studio.follow(studio.call("POST", f"/api/jobs/{job_id}/export", json=options))
