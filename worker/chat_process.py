"""The GPU chat process: `python -m lanner.worker.chat_process <job id>`, started by the worker for a
job of kind `chat` (lanner.backend.playground.gpu_session). It loads the training job's model on the
worker's device with transformers (the base model with the job's adapter, whose `base` side is the
adapter switched off; or a full fine-tune's model) and answers the session's questions from Redis,
one at a time, streaming tokens back, until no question came for the session's idle time or it is
closed. Exit codes as train_process: 0 closed or idle, 1 failed, 3 cancelled."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path

from lanner.core.models import ArtifactKind, Job
from lanner.core.spec import load_spec
from lanner.core.messages.chat import (CONTEXT_TOKENS, KEY_SECONDS, AnswerDone, AnswerError, AnswerStatus, AnswerToken,
                                      CloseSession, GenerateAnswer, answer_key, push, read_request, ready_key,
                                      requests_key, stop_key)
from lanner.worker.job_process import EXIT_CANCELLED, JobFailed, JobProcess, main


class ChatProcess(JobProcess):
    failure_prefix = "GPU chat failed"

    def __init__(self, job_id: int):
        super().__init__(job_id)
        self.redis = self.events.redis
        self.cancelled = False

    def on_sigterm(self, _signum, _frame):
        self.cancelled = True  # the current answer stops at its next token; then the session ends

    def load(self) -> tuple[Job, Job, str, Path]:
        with self.sessions() as session:
            job, parent, weights = self.parent_weights(session, "The training job of this chat session was deleted.")
            if weights is None:
                raise JobFailed(f"Job {parent.id} saved no adapter or model to chat with.")
            return job, parent, weights.kind, self.data_path(weights.path)

    def load_model(self, parent: Job, kind: str, path: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from lanner.worker.training.model import resolve_model

        cuda = torch.cuda.is_available()
        dtype = (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16) if cuda else torch.float32
        tokenizer = AutoTokenizer.from_pretrained(path)
        chat_template = load_spec(parent.config).chat_template
        if chat_template:
            tokenizer.chat_template = chat_template
        if kind == ArtifactKind.adapter:
            from peft import PeftModel

            base = AutoModelForCausalLM.from_pretrained(resolve_model(parent.model, self.settings), dtype=dtype)
            model = PeftModel.from_pretrained(base, str(path))
        else:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        return model.to("cuda" if cuda else "cpu").eval(), tokenizer

    def run(self) -> int:
        job, parent, kind, path = self.load()
        idle_seconds = int((job.config or {}).get("chat", {}).get("idle_seconds", 600))
        self.events.log(f"Loading job {parent.id}'s {kind} for chat")
        model, tokenizer = self.load_model(parent, kind, path)
        self.redis.set(ready_key(self.job_id), "1", ex=KEY_SECONDS)
        self.events.log(f"GPU chat ready on {model.device}; the session ends after {idle_seconds} s without a question")
        last = time.monotonic()
        try:
            while not self.cancelled:
                item = self.redis.blpop([requests_key(self.job_id)], timeout=1)
                if item is None:
                    if time.monotonic() - last > idle_seconds:
                        self.events.log(f"No question for {idle_seconds} s: the GPU chat session ends")
                        return 0
                    continue
                request = read_request(item[1])
                if isinstance(request, CloseSession):
                    self.events.log("The GPU chat session was closed")
                    return 0
                self.answer(model, tokenizer, kind == ArtifactKind.adapter, request)
                last = time.monotonic()
        finally:
            self.redis.delete(ready_key(self.job_id), requests_key(self.job_id))
        self.events.log("Cancelled: the GPU chat session ends")
        return EXIT_CANCELLED

    def answer(self, model, tokenizer, has_adapter: bool, request: GenerateAnswer) -> None:
        out, stop = answer_key(self.job_id, request.request_id), stop_key(self.job_id, request.request_id)
        started = time.monotonic()

        def send(event: AnswerStatus | AnswerToken | AnswerDone | AnswerError) -> None:
            push(self.redis, out, event)

        def stopped() -> bool:
            return self.cancelled or bool(self.redis.exists(stop))

        def done(finish_reason: str, chunks: int) -> None:
            send(AnswerDone(finish_reason=finish_reason, chunks=chunks, seconds=round(time.monotonic() - started, 3)))

        if stopped():
            return done("stopped", 0)
        if request.side == "base" and not has_adapter:
            return send(AnswerError(code="no_base_model", message="This job is a full fine-tune: its GPU session "
                                    "holds the fine-tuned model only. Chat with the base model on the CPU."))
        try:
            prompt = tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=False)
        except Exception as error:  # a template that refuses the conversation (roles, missing template)
            return send(AnswerError(code="bad_chat_template",
                                    message=f"The chat template refused this conversation: {error}"))
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        length = inputs["input_ids"].shape[1]
        if length >= CONTEXT_TOKENS:
            return send(AnswerError(code="context_full", message=f"The conversation is {length} tokens long and the "
                                    f"session reads at most {CONTEXT_TOKENS}: start a new chat or shorten it."))
        send(AnswerStatus(state="generating"))
        chunks, result = self._stream(model, tokenizer, inputs, request, request.side == "base", stopped, send)
        if "error" in result:
            error = result["error"]
            return send(AnswerError(code="generation_failed",
                                    message=f"Generation stopped: {type(error).__name__}: {error}"))
        new_tokens = result["output"].shape[1] - length
        done("stopped" if stopped() else "length" if new_tokens >= result["max_new_tokens"] else "stop", chunks)

    def _stream(self, model, tokenizer, inputs, request: GenerateAnswer, base: bool, stopped, send) -> tuple[int, dict]:
        """Generates on a thread while this one forwards the text as it comes."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        class Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.full((input_ids.shape[0],), stopped(), dtype=torch.bool, device=input_ids.device)

        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
        result = {"max_new_tokens": min(request.max_tokens, CONTEXT_TOKENS - inputs["input_ids"].shape[1])}
        options = dict(**inputs, max_new_tokens=result["max_new_tokens"], streamer=streamer,
                       stopping_criteria=StoppingCriteriaList([Stop()]), pad_token_id=tokenizer.eos_token_id,
                       do_sample=request.temperature > 0)
        if request.temperature > 0:
            options.update(temperature=request.temperature, top_p=request.top_p)
        if request.stop:
            options.update(stop_strings=request.stop, tokenizer=tokenizer)

        def generate() -> None:
            try:
                with model.disable_adapter() if base else contextlib.nullcontext(), torch.no_grad():
                    result["output"] = model.generate(**options)
            except Exception as error:  # reported to the user; the session goes on
                result["error"] = error
                streamer.end()

        thread = threading.Thread(target=generate, daemon=True)
        thread.start()
        chunks = 0
        for text in streamer:
            if text:
                chunks += 1
                send(AnswerToken(text=text))
        thread.join()
        return chunks, result


if __name__ == "__main__":
    sys.exit(main(ChatProcess, sys.argv))
