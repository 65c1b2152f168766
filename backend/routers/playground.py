"""The playground: chat with a finished job's fine-tuned model and its base model over a WebSocket,
and the before/after evaluation each SFT job stores (GET /api/jobs/{id}/evaluation).

/ws/playground signs in like the live streams. The client sends
  {"type": "generate", "id": any, "job_id": 5, "chats": {"tuned": [messages], "base": [messages]},
   "system": str|null, "temperature": 0.7, "top_p": 0.95, "max_tokens": 256, "stop": [str]}
(one key of `chats` for one model, both for side by side) and {"type": "stop"}. For each model it
answers {"type": "status", "model", "state": "loading"|"waiting"|"generating"}, then
{"type": "token", "model", "text"} as tokens come and one {"type": "done", "model", "finish_reason",
"chunks", "seconds"} or {"type": "error", "model", "code", "message"}; every message carries the
request's "id". Models run on the CPU from GGUF files (lanner.backend.playground) unless the request
names a GPU session ("gpu_session": the id of a `chat` job queued by POST
/api/playground/jobs/{id}/gpu-session): then the questions go to that job's process on a worker's
device through Redis, and while it waits in the queue the status is "queued" with its
"queue_position" (lanner.backend.playground.gpu_session)."""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from redis import Redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from lanner.core import db
from lanner.core.queue import order as queue_order
from lanner.backend.deps import (current_user, get_db, may_manage, per_user, redis_client, require_owner_or_admin,
                                 websocket_user)
from lanner.core.models import Artifact, ArtifactKind, Job, JobKind, JobStatus, User
from lanner.backend.paths import inside
from lanner.inference.cache import ModelCache, NotEnoughMemory
from lanner.inference.generation import (GenerationError, Sampling, add_context, chat_template,
                                                  context_bytes, estimate_bytes, load_llama, render_prompt,
                                                  stream_answer)
from lanner.backend.playground.gpu_session import start_session
from lanner.core.messages.chat import KEY_SECONDS, answer_key, ready_key, requests_key, stop_key
from lanner.backend.playground.settings import PlaygroundSettings
from lanner.backend.playground.sources import NotAvailable, Side, describe, model_file, training_job
from lanner.core.queue.claim import cancel_queued
from lanner.core.redis_client import get_redis
from lanner.backend.routers.jobs import job_out
from lanner.backend.schemas.common import MAX_ID, PathId, errors
from lanner.backend.schemas.jobs import JobOut
from lanner.core.settings import Settings, get_settings
from lanner.core.spec import load_spec

router = APIRouter(tags=["playground"])
log = logging.getLogger(__name__)
UNAUTHORISED = 4401
LISTED_JOBS = 100
_cache_lock = threading.Lock()


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str = Field(max_length=100_000)


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["generate"]
    id: str | int | None = None
    job_id: int = Field(ge=1, le=MAX_ID)
    chats: dict[Side, list[Message]] = Field(min_length=1, description="tuned, base or both (side by side)")
    system: str | None = Field(default=None, max_length=20_000)
    temperature: float = Field(default=0.7, ge=0, le=2)
    top_p: float = Field(default=0.95, gt=0, le=1)
    max_tokens: int = Field(default=256, ge=1, le=4096)
    stop: list[str] = Field(default_factory=list, max_length=8)
    gpu_session: int | None = Field(default=None, ge=1, le=MAX_ID,
                                    description="Answer on this GPU session (a chat job) instead of the CPU")

    @field_validator("chats")
    @classmethod
    def _ends_with_a_question(cls, chats: dict[str, list[Message]]) -> dict[str, list[Message]]:
        for side, messages in chats.items():
            if not messages or messages[-1].role != "user":
                raise ValueError(f"the {side} conversation must end with the user's message")
        return chats

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop: list[str]) -> list[str]:
        if any(not 1 <= len(text) <= 64 for text in stop):
            raise ValueError("each stop string has 1 to 64 characters")
        return stop

    def conversation(self, side: Side) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system and self.system.strip() else []
        return system + [message.model_dump() for message in self.chats[side]]

    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_p, self.max_tokens, list(self.stop))


def playground_cache(app) -> ModelCache:
    """One cache per app (so per API process), made on first use."""
    with _cache_lock:
        if getattr(app.state, "playground_cache", None) is None:
            settings = PlaygroundSettings()
            app.state.playground_cache = ModelCache(
                settings.cache_bytes, functools.partial(load_llama, extra_buffers=settings.cpu_extra_buffers),
                estimate_bytes, add_context=add_context,
                context_bytes=context_bytes, contexts_per_model=settings.contexts_per_model)
        return app.state.playground_cache


# ---- REST -------------------------------------------------------------------------------------

@router.get("/api/playground/jobs")
def playground_jobs(_: User = Depends(current_user), session: Session = Depends(get_db),
                    settings: Settings = Depends(get_settings)) -> list[dict[str, Any]]:
    """The finished training jobs, newest first, each with the GGUF of both sides or why there is none."""
    jobs = session.scalars(select(Job).where(Job.kind == JobKind.train, Job.status == JobStatus.succeeded)
                           .order_by(Job.id.desc()).limit(LISTED_JOBS))
    return [describe(session, settings, job) for job in jobs]


@router.get("/api/playground/jobs/{job_id}")
def playground_job(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
                   settings: Settings = Depends(get_settings)) -> dict[str, Any]:
    try:
        job = training_job(session, job_id)
    except NotAvailable as error:
        raise HTTPException(404 if error.code == "no_job" else 409, str(error)) from None
    return describe(session, settings, job)


def _evaluation_view(data: dict[str, Any], job: Job) -> dict[str, Any]:
    status, error = data.get("status"), data.get("error")
    if status == "running" and job.status != JobStatus.running:
        status, error = "failed", f"The job ended ({job.status.value}) before its evaluation finished."
    samples = [{key: sample.get(key) for key in ("prompt", "reference", "base_answer", "tuned_answer",
                                                 "base_overlap", "tuned_overlap")}
               for sample in data.get("samples", [])]
    scores = data.get("scores") or {}
    return {"status": status, "error": error, "prompts_from": data.get("prompts_from"),
            "base_eval_loss": data.get("base_eval_loss"),
            "tuned_eval_loss": data.get("tuned_eval_loss"), "samples": samples,
            "scores": {"base_overlap": scores.get("base_overlap", 0.0), "tuned_overlap": scores.get("tuned_overlap", 0.0)}}


@router.get("/api/jobs/{job_id}/evaluation")
def job_evaluation(job_id: PathId, _: User = Depends(current_user), session: Session = Depends(get_db),
                   settings: Settings = Depends(get_settings)) -> dict[str, Any]:
    """The before/after evaluation written at the end of an SFT job (404 when it made none)."""
    job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(404, f"No job {job_id}")
    artifact = session.scalars(select(Artifact).where(Artifact.job_id == job_id, Artifact.kind == ArtifactKind.evaluation)
                               .order_by(Artifact.id.desc())).first()
    if artifact is None:
        raise HTTPException(404, f"Job {job_id} has no before/after evaluation")
    path = settings.data_dir / artifact.path
    if not inside(settings.data_dir, artifact.path) or not path.is_file():
        raise HTTPException(404, f"The evaluation file of job {job_id} is missing")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        return _evaluation_view({"status": "failed", "error": f"The evaluation file is unreadable: {error}"}, job)
    return _evaluation_view(data, job)


class GpuSessionCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    idle_seconds: int | None = Field(default=None, ge=10, le=86_400, description="Ends after this long without "
                                     "a question (default LANNER_PLAYGROUND_GPU_IDLE_SECONDS)")


@router.post("/api/playground/jobs/{job_id}/gpu-session", response_model=JobOut, status_code=201,
             dependencies=[per_user("jobs")], responses=errors(404, 409))
def start_gpu_session(job_id: PathId, body: GpuSessionCreate = Body(default_factory=GpuSessionCreate),
                      user: User = Depends(current_user), session: Session = Depends(get_db),
                      redis: Redis = Depends(redis_client), settings: Settings = Depends(get_settings)) -> JobOut:
    """Queues a GPU chat session with a finished job's model: a job of kind `chat` that holds a worker's
    device from when the queue gives it one until it is closed or idles out. Returns the caller's open
    session with that job's model when there is one. Send its id as "gpu_session" on /ws/playground."""
    try:
        job = training_job(session, job_id)
        chat = start_session(session, redis, settings, user, job,
                             body.idle_seconds or PlaygroundSettings().gpu_idle_seconds)
    except NotAvailable as error:
        raise HTTPException(404 if error.code == "no_job" else 409, str(error)) from None
    return job_out(session, redis, chat)


@router.post("/api/playground/gpu-sessions/{session_id}/close", response_model=JobOut, responses=errors(403, 404, 409))
def close_gpu_session(session_id: PathId, user: User = Depends(current_user), session: Session = Depends(get_db),
                      redis: Redis = Depends(redis_client)) -> JobOut:
    """Ends a GPU chat session: a queued one is cancelled, a running one finishes after the answer it is
    giving, and its worker takes the next job."""
    chat = session.get(Job, session_id)
    if chat is None or chat.kind != JobKind.chat:
        raise HTTPException(404, f"No GPU chat session {session_id}")
    require_owner_or_admin(user, chat.owner_id, "close this GPU chat session")
    if chat.status == JobStatus.queued:
        cancel_queued(session, redis, chat, user.id)
    elif chat.status == JobStatus.running:
        redis.rpush(requests_key(chat.id), json.dumps({"type": "close"}))
        redis.expire(requests_key(chat.id), KEY_SECONDS)
    else:
        raise HTTPException(409, f"GPU chat session {session_id} has already ended ({chat.status.value})")
    return job_out(session, redis, chat)


# ---- WebSocket --------------------------------------------------------------------------------

def _signed_in(websocket: WebSocket, settings: Settings) -> User | None:
    with db.session_factory(settings.database_url)() as session:
        return websocket_user(websocket, session, get_redis(settings.redis_url))


def _resolve(settings: Settings, request: GenerateRequest, user: User) -> tuple[dict[Side, Any], str | None]:
    """The GGUF file of each side asked for, and the chat template the job trained with (if it set one);
    for a GPU session only the checks that the session is the user's and holds the job's model."""
    with db.session_factory(settings.database_url)() as session:
        job = training_job(session, request.job_id)
        if request.gpu_session is not None:
            chat = session.get(Job, request.gpu_session)
            if chat is None or chat.kind != JobKind.chat or chat.parent_job_id != job.id:
                raise NotAvailable("no_gpu_session", f"There is no GPU session {request.gpu_session} with job "
                                                     f"{job.id}'s model: start one first.")
            if not may_manage(user, chat.owner_id):
                raise NotAvailable("not_your_gpu_session", f"GPU session {chat.id} is someone else's: start your own.")
            return {}, None
        files = {side: model_file(session, settings, job, side) for side in request.chats}
        return files, load_spec(job.config).chat_template


def _gpu_session_state(settings: Settings, redis: Redis, job_id: int) -> tuple[JobStatus, int | None, str | None]:
    """The session job's status, its place in the queue while queued, and its error once failed."""
    with db.session_factory(settings.database_url)() as session:
        job = session.get(Job, job_id)
        if job is None:
            return JobStatus.cancelled, None, "The session was deleted."
        position = queue_order.queue_view(session, redis).get(job_id, (None, None))[0] \
            if job.status == JobStatus.queued else None
        return job.status, position, job.error


class Generation:
    """One generate request: a thread per model, messages handed to the event loop's queue."""

    def __init__(self, request: GenerateRequest, emit):
        self.request = request
        self.stop = threading.Event()
        self._emit = emit
        self.unanswered = set(request.chats)  # the sides whose done or error is still to come

    def emit(self, message: dict[str, Any]) -> None:
        if message["type"] in ("done", "error"):
            self.unanswered.discard(message["model"])
        self._emit({**message, "id": self.request.id})

    def running(self) -> bool:
        """Until every side has sent its last message (its thread may still be tidying up)."""
        return bool(self.unanswered)

    def start(self, cache: ModelCache, files: dict, template: str | None, settings: Settings) -> None:
        if self.request.gpu_session is not None:
            for side in self.request.chats:
                self._thread(side, self._relay, settings, side)
            return
        for side, found in files.items():
            if not found.available:
                self.emit({"type": "error", "model": side, "code": found.code, "message": found.reason,
                           **({"export_url": f"/api/jobs/{self.request.job_id}/export"}
                              if found.code == "not_exported" else {})})
                continue
            self._thread(side, self._answer, cache, side, found.path, template)

    def _thread(self, side: Side, target, *args) -> None:
        threading.Thread(target=target, args=args, name=f"playground-{side}", daemon=True).start()

    def _answer(self, cache: ModelCache, side: Side, path, template: str | None) -> None:
        started = time.monotonic()
        try:
            if path not in cache.loaded():
                self.emit({"type": "status", "model": side, "state": "loading"})
            with cache.use(path) as entry, cache.context(
                    entry, lambda: self.emit({"type": "status", "model": side, "state": "waiting"}),
                    self.stop.is_set) as llama:
                if llama is None:
                    self.emit({"type": "done", "model": side, "finish_reason": "stopped", "chunks": 0,
                               "seconds": round(time.monotonic() - started, 3)})
                    return
                self._generate(llama, side, template, started)
        except (NotEnoughMemory, GenerationError) as error:
            self.emit({"type": "error", "model": side, "code": getattr(error, "code", "not_enough_memory"),
                       "message": str(error)})
        except Exception as error:
            log.exception("Playground generation failed")
            self.emit({"type": "error", "model": side, "code": "failed",
                       "message": f"The model could not answer: {type(error).__name__}: {error}"})

    def _generate(self, llama, side: Side, template: str | None, started: float) -> None:
        prompt = render_prompt(llama, self.request.conversation(side), chat_template(llama, template))
        self.emit({"type": "status", "model": side, "state": "generating"})
        chunks = 0
        for piece in stream_answer(llama, prompt, self.request.sampling(), self.stop.is_set):
            if "text" in piece:
                chunks += 1
                self.emit({"type": "token", "model": side, "text": piece["text"]})
            else:
                self.emit({"type": "done", "model": side, "finish_reason": piece["finish_reason"], "chunks": chunks,
                           "seconds": round(time.monotonic() - started, 3)})

    def _relay(self, settings: Settings, side: Side) -> None:
        """One answer from a GPU session: wait while the session is queued or loading, push the
        question, forward what its process sends until `done` or `error`."""
        started, job_id = time.monotonic(), self.request.gpu_session
        try:
            redis = get_redis(settings.redis_url)
            if not self._wait_for_session(settings, redis, side, started):
                return
            request_id = uuid.uuid4().hex
            redis.rpush(requests_key(job_id), json.dumps({
                "type": "generate", "request_id": request_id, "side": side, "messages": self.request.conversation(side),
                "temperature": self.request.temperature, "top_p": self.request.top_p,
                "max_tokens": self.request.max_tokens, "stop": self.request.stop}))
            redis.expire(requests_key(job_id), KEY_SECONDS)
            stop_sent = False
            while True:
                item = redis.blpop([answer_key(job_id, request_id)], timeout=1)
                if self.stop.is_set() and not stop_sent:
                    redis.set(stop_key(job_id, request_id), "1", ex=KEY_SECONDS)
                    stop_sent = True
                if item is None:
                    status, _, error = _gpu_session_state(settings, redis, job_id)
                    if status != JobStatus.running:
                        self.emit({"type": "error", "model": side, "code": "gpu_session_ended",
                                   "message": f"Generation stopped: the GPU session (job {job_id}) ended "
                                              f"({status.value}){': ' + error if error else ''}."})
                        return
                    continue
                message = json.loads(item[1])
                self.emit({**message, "model": side})
                if message["type"] in ("done", "error"):
                    redis.delete(answer_key(job_id, request_id), stop_key(job_id, request_id))
                    return
        except Exception as error:
            log.exception("Playground GPU relay failed")
            self.emit({"type": "error", "model": side, "code": "failed",
                       "message": f"The GPU session could not answer: {type(error).__name__}: {error}"})

    def _wait_for_session(self, settings: Settings, redis: Redis, side: Side, started: float) -> bool:
        """Until the session's process has loaded the model: status `queued` (with the queue position,
        each time it changes), then `loading`. False (and the reason sent) when it ended or was stopped."""
        job_id, shown = self.request.gpu_session, None
        while True:
            status, position, error = _gpu_session_state(settings, redis, job_id)
            if status == JobStatus.running and redis.exists(ready_key(job_id)):
                return True
            if status not in (JobStatus.queued, JobStatus.running):
                self.emit({"type": "error", "model": side, "code": "gpu_session_ended",
                           "message": f"The GPU session (job {job_id}) has ended ({status.value})"
                                      f"{': ' + error if error else ''}. Start a new one to chat on a GPU."})
                return False
            state = ("queued", position) if status == JobStatus.queued else ("loading", None)
            if state != shown:
                shown = state
                self.emit({"type": "status", "model": side, "state": state[0], "gpu_session": job_id,
                           **({"queue_position": position} if status == JobStatus.queued else {})})
            if self.stop.wait(1):
                self.emit({"type": "done", "model": side, "finish_reason": "stopped", "chunks": 0,
                           "seconds": round(time.monotonic() - started, 3)})
                return False


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
        await websocket.close(UNAUTHORISED, "Sign in first (session cookie or ?token=<API token>)")
        return
    cache = playground_cache(websocket.app)
    loop = asyncio.get_running_loop()
    outgoing: asyncio.Queue = asyncio.Queue()

    def emit(message: dict[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(outgoing.put_nowait, message)
        except RuntimeError:  # the socket's loop is gone: nobody is listening any more
            pass

    sender = asyncio.ensure_future(_send_all(websocket, outgoing))
    current: Generation | None = None
    try:
        while True:
            text = await websocket.receive_text()
            try:
                message = json.loads(text)
                kind = message.get("type") if isinstance(message, dict) else None
            except ValueError:
                kind = None
            if kind == "stop":
                if current is not None:
                    current.stop.set()
            elif kind == "generate":
                if current is not None and current.running():
                    emit({"type": "error", "model": None, "code": "busy", "id": message.get("id"),
                          "message": "An answer is still coming: stop it or wait for it before asking again."})
                    continue
                try:
                    request = GenerateRequest.model_validate(message)
                    files, template = await asyncio.to_thread(_resolve, settings, request, user)
                except ValidationError as error:
                    emit({"type": "error", "model": None, "code": "bad_request", "id": message.get("id"),
                          "message": _problem(error)})
                    continue
                except NotAvailable as error:
                    emit({"type": "error", "model": None, "code": error.code, "id": message.get("id"),
                          "message": str(error)})
                    continue
                current = Generation(request, emit)
                current.start(cache, files, template, settings)
            else:
                emit({"type": "error", "model": None, "code": "bad_request", "id": None,
                      "message": 'Send {"type": "generate", …} or {"type": "stop"}.'})
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        if current is not None:
            current.stop.set()  # a closed tab stops its answers at the next token
        sender.cancel()
