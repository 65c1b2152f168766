"""The playground: chat with a finished job's fine-tuned model and its base model over a WebSocket,
and the before/after evaluation each SFT job stores (GET /api/jobs/{id}/evaluation).

/ws/playground signs in like the live streams. The client sends
  {"type": "generate", "id": any, "job_id": 5, "chats": {"tuned": [messages], "base": [messages]},
   "system": str|null, "temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "stop": [str]}
(one key of `chats` for one model, both for side by side) and {"type": "stop"}. For each model it
answers {"type": "status", "model", "state": "loading"|"waiting"|"generating"}, then
{"type": "token", "model", "text"} as tokens come and one {"type": "done", "model", "finish_reason",
"chunks", "seconds"} or {"type": "error", "model", "code", "message"}; every message carries the
request's "id". Models run on the CPU from GGUF files (lanner.backend.playground.answers) unless
the request names a GPU session ("gpu_session": the id of a `chat` job queued by POST
/api/playground/jobs/{id}/gpu-session): then the questions go to that job's process on a worker's
device through Redis, and while it waits in the queue the status is "queued" with its
"queue_position" (lanner.backend.playground.gpu_session, gpu_relay). This module only speaks HTTP
and the socket; the work is lanner.backend.playground's."""
from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Body, Depends, WebSocket, WebSocketDisconnect
from pydantic import ValidationError
from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.backend.deps import WS_UNAUTHORISED, current_user, get_db, per_user, redis_client, websocket_user
from lanner.backend.playground.answers import REFUSED, Answers, model_cache, resolve
from lanner.backend.playground import evaluation
from lanner.backend.playground.gpu_session import close_session, start_session
from lanner.backend.playground.settings import PlaygroundSettings
from lanner.backend.playground.sources import describe, training_job
from lanner.backend.routers.jobs import job_out
from lanner.backend.schemas.common import PathId, errors
from lanner.backend.schemas.jobs import JobOut
from lanner.backend.schemas.playground import (EvaluationOut, GenerateRequest, GpuSessionCreate, PlaygroundJobOut,
                                               socket_message)
from lanner.core import db, strict_json
from lanner.core.errors import UserError
from lanner.core.messages.chat import AnswerError
from lanner.core.models import Job, JobKind, JobStatus, User
from lanner.core.redis_client import get_redis
from lanner.core.settings import Settings, get_settings
from lanner.core.spec import REWARD_MODEL_METHODS

router = APIRouter(tags=["playground"])
LISTED_JOBS = 100


# ---- REST -------------------------------------------------------------------------------------

@router.get("/api/playground/jobs", response_model=list[PlaygroundJobOut])
def playground_jobs(_: User = Depends(current_user), session: Session = Depends(get_db),
                    settings: Settings = Depends(get_settings)) -> list[dict[str, Any]]:
    """The finished training jobs but reward models, newest first, each with the GGUF of both sides or why there is none."""
    jobs = session.scalars(select(Job).where(Job.kind == JobKind.train, Job.status == JobStatus.succeeded,
                                             Job.method.not_in(REWARD_MODEL_METHODS))  # they write no text
                           .order_by(Job.id.desc()).limit(LISTED_JOBS))
    return [describe(session, settings, job) for job in jobs]


@router.get("/api/playground/jobs/{job_id}", response_model=PlaygroundJobOut)
def playground_job(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
                   settings: Settings = Depends(get_settings)) -> dict[str, Any]:
    return describe(session, settings, training_job(session, job_id))


@router.get("/api/jobs/{job_id}/evaluation", response_model=EvaluationOut)
def job_evaluation(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
                   settings: Settings = Depends(get_settings)) -> dict[str, Any]:
    """The before/after evaluation written at the end of an SFT job (404 when it made none)."""
    return evaluation.job_evaluation(session, settings, job_id)


@router.post("/api/playground/jobs/{job_id}/gpu-session", response_model=JobOut, status_code=201,
             dependencies=[per_user("jobs")], responses=errors(404, 409))
def start_gpu_session(job_id: PathId, body: GpuSessionCreate = Body(default_factory=GpuSessionCreate),
                      user: User = Depends(current_user), session: Session = Depends(get_db),
                      redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues a GPU chat session with a finished job's model: a job of kind `chat` that holds a worker's
    device from when the queue gives it one until it is closed or idles out. Returns the caller's open
    session with that job's model when there is one. Send its id as "gpu_session" on /ws/playground."""
    chat = start_session(session, redis, settings, user, training_job(session, job_id),
                         body.idle_seconds or PlaygroundSettings().gpu_idle_seconds)
    return job_out(session, redis, chat)


@router.post("/api/playground/gpu-sessions/{session_id}/close", response_model=JobOut, responses=errors(403, 404, 409))
def close_gpu_session(session_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db),
                      redis: Redis = Depends(redis_client)) -> JobOut:
    """Ends a GPU chat session: a queued one is cancelled, a running one finishes after the answer it is
    giving, and its worker takes the next job."""
    return job_out(session, redis, close_session(session, redis, user, session_id))


# ---- WebSocket --------------------------------------------------------------------------------

def _signed_in(websocket: WebSocket, settings: Settings) -> User | None:
    with db.session_factory(settings.database_url)() as session:
        return websocket_user(websocket, session, get_redis(settings.redis_url))


def _problem(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(part) for part in issue['loc'])}: {issue['msg']}".lstrip(": ")
                     for issue in error.errors())


async def _send_all(websocket: WebSocket, outgoing: asyncio.Queue) -> None:
    try:
        while True:
            await websocket.send_text(json.dumps(await outgoing.get()))
    except (WebSocketDisconnect, RuntimeError):
        pass  # the client is gone; the receiving side notices and stops the answers


@router.websocket("/ws/playground")
async def playground_socket(websocket: WebSocket) -> None:
    settings = get_settings()
    await websocket.accept()
    user = await asyncio.to_thread(_signed_in, websocket, settings)
    if user is None:
        await websocket.close(WS_UNAUTHORISED, "Sign in first (session cookie or ?token=<API token>)")
        return
    cache = model_cache(websocket.app)
    loop = asyncio.get_running_loop()
    outgoing: asyncio.Queue = asyncio.Queue()

    def emit(message: dict[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(outgoing.put_nowait, message)
        except RuntimeError:  # the socket's loop is gone: nobody is listening any more
            pass

    def refuse(code: str, message: str, request_id: Any = None) -> None:
        emit(socket_message(AnswerError(code=code, message=message), model=None, id=request_id))

    sender = asyncio.ensure_future(_send_all(websocket, outgoing))
    current: Answers | None = None
    try:
        while True:
            received = await websocket.receive()
            if received["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(received.get("code", 1000))
            try:  # strict: NaN, nesting too deep to parse or a lone surrogate is a bad request, not a dropped socket
                message = strict_json.loads(received["text"]) if received.get("text") is not None else None
                kind = message.get("type") if isinstance(message, dict) else None
            except ValueError:
                kind = None
            if kind == "stop":
                if current is not None:
                    current.stop.set()
            elif kind == "generate":
                if await asyncio.to_thread(_signed_in, websocket, settings) is None:  # signed out since
                    await websocket.close(WS_UNAUTHORISED, "The session ended: sign in again")
                    return
                if current is not None and current.running():
                    refuse("busy", "An answer is still coming: stop it or wait for it before asking again.",
                           message.get("id"))
                    continue
                try:
                    request = GenerateRequest.model_validate(message)
                    files, template = await asyncio.to_thread(resolve, settings, request, user)
                except ValidationError as error:
                    refuse("bad_request", _problem(error), message.get("id"))
                    continue
                except UserError as error:
                    refuse(error.code or REFUSED, error.message, message.get("id"))
                    continue
                current = Answers(request, emit)
                current.start(cache, files, template, settings)
            else:
                refuse("bad_request", 'Send {"type": "generate", …} or {"type": "stop"}.')
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        if current is not None:
            current.stop.set()  # a closed tab stops its answers at the next token
        sender.cancel()
