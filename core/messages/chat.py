"""GPU chat messages between the API's playground socket and the worker's chat process, through Redis.

Per session job: REQUESTS (a list) carries generate and close requests in; ANSWER (a list per request)
carries the playground's status/token/done/error messages out; STOP asks one answer to end; READY is set
once the model is loaded."""
from __future__ import annotations

CONTEXT_TOKENS = 4096   # prompt + answer, as on the CPU path
KEY_SECONDS = 3600      # Redis keys of a session outlive no session by more than this


def requests_key(job_id: int) -> str:
    return f"lanner:chat:{job_id}:requests"


def answer_key(job_id: int, request_id: str) -> str:
    return f"lanner:chat:{job_id}:answer:{request_id}"


def stop_key(job_id: int, request_id: str) -> str:
    return f"lanner:chat:{job_id}:stop:{request_id}"


def ready_key(job_id: int) -> str:
    return f"lanner:chat:{job_id}:ready"
