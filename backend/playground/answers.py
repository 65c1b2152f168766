"""One generate request of the playground socket: a thread per side (tuned, base), each answering on
the CPU from a GGUF through llama.cpp, or relayed to a GPU session (gpu_relay.py); every message goes
to the socket through `emit` as the side's chat event with the side (`model`) and the request's id."""
from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from lanner.backend.playground import gpu_relay
from lanner.backend.playground.gpu_session import usable_session
from lanner.backend.playground.settings import PlaygroundSettings
from lanner.backend.playground.sources import ModelFile, model_file, training_job
from lanner.backend.schemas.playground import GenerateRequest, socket_message
from lanner.core import db
from lanner.core.errors import UserError
from lanner.core.messages.chat import (FINAL_EVENTS, AnswerDone, AnswerError, AnswerStatus, AnswerToken, ChatEvent,
                                      Side)
from lanner.core.models import User
from lanner.core.settings import Settings
from lanner.core.spec import load_spec
from lanner.inference.availability import require_llama_cpp
from lanner.inference.cache import ModelCache
from lanner.inference.generation import (add_context, chat_template, context_bytes, estimate_bytes, load_llama,
                                         render_prompt, stream_answer)

log = logging.getLogger(__name__)
_cache_lock = threading.Lock()
REFUSED = "refused"  # the code of a UserError raised without one


def model_cache(app) -> ModelCache:
    """The loaded GGUF models: one cache per app (so per API process), made on first use."""
    with _cache_lock:
        if getattr(app.state, "playground_cache", None) is None:
            settings = PlaygroundSettings()
            app.state.playground_cache = ModelCache(
                settings.cache_bytes, functools.partial(load_llama, extra_buffers=settings.cpu_extra_buffers),
                estimate_bytes, add_context=add_context,
                context_bytes=context_bytes, contexts_per_model=settings.contexts_per_model)
        return app.state.playground_cache


def resolve(settings: Settings, request: GenerateRequest, user: User) -> tuple[dict[Side, ModelFile], str | None]:
    """The GGUF file of each side asked for, and the chat template the job trained with (if it set one);
    for a GPU session only the checks that the session is the user's and holds the job's model.
    UserError (with its code) when the request cannot be answered."""
    with db.session_factory(settings.database_url)() as session:
        job = training_job(session, request.job_id)
        if request.gpu_session is not None:
            usable_session(session, user, request.gpu_session, job)
            return {}, None
        require_llama_cpp("Chat on the CPU")
        files = {side: model_file(session, settings, job, side) for side in request.chats}
        return files, load_spec(job.config).chat_template


class Answers:
    """The answers to one generate request, a thread per side."""

    def __init__(self, request: GenerateRequest, emit: Callable[[dict[str, Any]], None]):
        self.request = request
        self.stop = threading.Event()
        self._emit = emit
        self.unanswered = set(request.chats)  # the sides whose done or error is still to come

    def emit(self, side: Side, event: ChatEvent, **extra: Any) -> None:
        if isinstance(event, FINAL_EVENTS):
            self.unanswered.discard(side)
        self._emit(socket_message(event, model=side, id=self.request.id, **extra))

    def done(self, side: Side, finish_reason: str, chunks: int, started: float) -> None:
        self.emit(side, AnswerDone(finish_reason=finish_reason, chunks=chunks,
                                   seconds=round(time.monotonic() - started, 3)))

    def running(self) -> bool:
        """Until every side has sent its last message (its thread may still be tidying up)."""
        return bool(self.unanswered)

    def start(self, cache: ModelCache, files: dict[Side, ModelFile], template: str | None, settings: Settings) -> None:
        if self.request.gpu_session is not None:
            for side in self.request.chats:
                self._thread(side, gpu_relay.relay, self, settings, side)
            return
        for side, found in files.items():
            if not found.available:
                self.emit(side, AnswerError(code=found.code, message=found.reason),
                          **({"export_url": f"/api/jobs/{self.request.job_id}/export"}
                             if found.code == "not_exported" else {}))
                continue
            self._thread(side, self._answer, cache, side, found.path, template)

    def _thread(self, side: Side, target, *args) -> None:
        threading.Thread(target=target, args=args, name=f"playground-{side}", daemon=True).start()

    def _answer(self, cache: ModelCache, side: Side, path, template: str | None) -> None:
        started = time.monotonic()
        try:
            if path not in cache.loaded():
                self.emit(side, AnswerStatus(state="loading"))
            with cache.use(path) as entry, cache.context(
                    entry, lambda: self.emit(side, AnswerStatus(state="waiting")), self.stop.is_set) as llama:
                if llama is None:
                    self.done(side, "stopped", 0, started)
                    return
                self._generate(llama, side, template, started)
        except UserError as error:
            self.emit(side, AnswerError(code=error.code or REFUSED, message=error.message))
        except Exception as error:
            log.exception("Playground generation failed")
            self.emit(side, AnswerError(code="failed",
                                        message=f"The model could not answer: {type(error).__name__}: {error}"))

    def _generate(self, llama, side: Side, template: str | None, started: float) -> None:
        prompt = render_prompt(llama, self.request.conversation(side), chat_template(llama, template))
        self.emit(side, AnswerStatus(state="generating"))
        chunks = 0
        for piece in stream_answer(llama, prompt, self.request.sampling(), self.stop.is_set):
            if "text" in piece:
                chunks += 1
                self.emit(side, AnswerToken(text=piece["text"]))
            else:
                self.done(side, piece["finish_reason"], chunks, started)
