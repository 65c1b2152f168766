"""One streamed answer from a GGUF model through llama-cpp-python, on the CPU.

The prompt is rendered here with the chat template the job trained with (its `chat_template` option)
or, by default, the one stored in the GGUF, so the model sees exactly the layout it was tuned on.
Everything here blocks: the router runs it on a thread of its own."""
from __future__ import annotations

import functools
import os
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lanner.core.errors import UserError

# Tokens of context each loaded model gets (prompt + answer); the KV cache is sized for it.
CONTEXT_TOKENS = 4096
# llama.cpp's compute and output buffers besides the weights and the KV cache (measured: tens of MB
# for models up to 8B at this context; rounded up).
BUFFERS_BYTES = 160 * 2**20


@dataclass
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)


def _threads() -> int:
    # Half the cores: the API, the other side of a side-by-side chat and a CPU worker need the rest.
    return max(1, (os.cpu_count() or 2) // 2)


_defaults_lock = threading.Lock()


def open_llama(path: Path, extra_buffers: bool = False, **llama_kwargs):
    """llama.cpp's Llama on a GGUF file. `extra_buffers`: llama.cpp's AMX and repacked weight layouts
    (faster prompts on CPUs with AMX), off by default: in VMs that advertise AMX without enabling it
    the first tile instruction (a q8_0 or q4 matmul) kills the whole process (seen on Firecracker).
    Llama() does not take the switch, so its model defaults are swapped while it loads."""
    import llama_cpp.llama as llama_module
    from llama_cpp import Llama

    def load():
        return Llama(model_path=str(path), verbose=False, **llama_kwargs)

    if extra_buffers:
        return load()
    with _defaults_lock:
        defaults = llama_module.llama_cpp.llama_model_default_params

        def without_extra_buffers():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_module.llama_cpp.llama_model_default_params = without_extra_buffers
        try:
            return load()
        finally:
            llama_module.llama_cpp.llama_model_default_params = defaults


def load_llama(path: Path, extra_buffers: bool = False):
    """A model for the playground, with its first context."""
    return open_llama(path, extra_buffers, n_ctx=CONTEXT_TOKENS, n_gpu_layers=0, n_threads=_threads())


def add_context(llama):
    """Another llama.cpp context (KV cache, batch, sampler state) on `llama`'s loaded weights, so two
    answers of one model run at once without a second copy of the model. llama-cpp-python 0.3 has no
    public way to share a model between Llama objects: this copies the object and replaces what
    belongs to its context (tests/inference/test_model_cache.py checks it on the installed version).
    Close it before `llama`, which owns the weights."""
    import contextlib
    import ctypes

    import numpy as np
    from llama_cpp import _internals as internals

    twin = object.__new__(type(llama))  # not copy.copy: Llama pickles as its arguments, a reload
    twin.__dict__.update(llama.__dict__)
    twin._stack = contextlib.ExitStack()
    twin._ctx = twin._stack.enter_context(contextlib.closing(
        internals.LlamaContext(model=llama._model, params=llama.context_params, verbose=llama.verbose)))
    twin._batch = twin._stack.enter_context(contextlib.closing(
        internals.LlamaBatch(n_tokens=llama.n_batch, embd=0, n_seq_max=llama.context_params.n_ctx,
                             verbose=llama.verbose)))
    twin._candidates = internals.LlamaTokenDataArray(n_vocab=llama._n_vocab)
    twin.input_ids = np.ndarray(llama.input_ids.shape, dtype=np.intc)
    twin.scores = np.ndarray(llama.scores.shape, dtype=np.single)
    twin.n_tokens, twin._requires_eval, twin._sampler, twin.cache = 0, True, None, None
    twin._mirostat_mu = ctypes.c_float(2.0 * 5.0)
    return twin


def context_bytes(path: Path) -> int:
    """Memory one llama.cpp context of the model takes: its f16 KV cache for CONTEXT_TOKENS and buffers."""
    try:
        meta = gguf_header(path)
        arch = meta["general.architecture"]
        layers, width, heads = (meta[f"{arch}.{key}"] for key in
                                ("block_count", "embedding_length", "attention.head_count"))
        kv_heads = meta.get(f"{arch}.attention.head_count_kv") or heads
        head_dim = meta.get(f"{arch}.attention.key_length") or width // heads
        kv = 2 * layers * CONTEXT_TOKENS * kv_heads * head_dim * 2
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError, struct.error):
        kv = Path(path).stat().st_size // 4  # an architecture without these keys: a generous guess
    return kv + BUFFERS_BYTES


def estimate_bytes(path: Path) -> int:
    """Memory a loaded model takes with its first context: its weights (the file) and context_bytes."""
    return Path(path).stat().st_size + context_bytes(path)


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_header(path: Path) -> dict[str, Any]:
    """The scalar and string metadata of a GGUF file (arrays, such as the vocabulary, are skipped).
    gguf.GGUFReader reads the whole vocabulary into Python objects: 20 s for SmolLM2 on this box."""
    with open(path, "rb") as file:
        def read(fmt: str):
            return struct.unpack(fmt, file.read(struct.calcsize(fmt)))[0]

        def string() -> str:
            return file.read(read("<Q")).decode("utf-8", errors="replace")

        def skip(kind: int, count: int = 1) -> None:
            if kind in _SCALARS:
                file.seek(struct.calcsize(_SCALARS[kind]) * count, os.SEEK_CUR)
            elif kind == _STRING:
                for _ in range(count):
                    file.seek(read("<Q"), os.SEEK_CUR)
            elif kind == _ARRAY:
                for _ in range(count):
                    inner = read("<I")
                    skip(inner, read("<Q"))
            else:
                raise ValueError(f"unknown GGUF value type {kind}")

        if file.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        read("<I")  # version
        read("<Q")  # tensor count
        meta: dict[str, Any] = {}
        for _ in range(read("<Q")):
            key, kind = string(), read("<I")
            if kind in _SCALARS:
                meta[key] = read(_SCALARS[kind])
            elif kind == _STRING:
                meta[key] = string()
            else:
                skip(kind)
        return meta


def _special_text(llama, token: int) -> str:
    return llama.detokenize([token], special=True).decode("utf-8", errors="ignore") if token >= 0 else ""


def chat_template(llama, override: str | None) -> str:
    template = override or llama.metadata.get("tokenizer.chat_template")
    if not template:
        raise UserError(409, "This GGUF has no chat template and the job set none; re-export it from a model "
                             "whose tokenizer has one.", code="no_chat_template")
    return template


# A chat template is a program of the job's owner: it renders in a child process of its own, given this long
# and this much memory above what the child starts with (a conversation renders in milliseconds, in kilobytes),
# so that a template's endless loop or huge string costs neither the API's memory nor a thread forever.
RENDER_SECONDS = 10.0
RENDER_MEMORY_BYTES = 2**30
# A prompt longer than this holds far more tokens than any context the playground gives a model: not sent back.
PROMPT_MAX_CHARS = 2**24
RENDER_MODULE = "llama_cpp.llama_chat_format"


@functools.cache
def _render_context():
    """A forkserver that has imported the formatter: each render forks from it (milliseconds), not from the
    API process and its threads. Set up once (two first calls at once would only set the same preload twice)."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([RENDER_MODULE])
    return context


def _render_child(connection, template: str, messages: list[dict[str, str]], eos: str, bos: str) -> None:
    """In the child: the prompt, or why the template could not make it, sent back as (kind, text)."""
    try:
        import resource

        with open("/proc/self/statm") as statm:  # address space in use, in pages
            in_use = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (in_use + RENDER_MEMORY_BYTES, in_use + RENDER_MEMORY_BYTES))
    except (OSError, ValueError, ImportError):  # no /proc (not Linux): the time limit still holds
        pass
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    try:
        formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos, add_generation_prompt=True)
        prompt = formatter(messages=messages).prompt
        outcome = ("prompt", prompt) if len(prompt) <= PROMPT_MAX_CHARS else (
            "refused", f"it made a prompt of {len(prompt):,} characters, far more than a model's context holds")
    except MemoryError:
        outcome = ("refused", f"it needed more than {RENDER_MEMORY_BYTES // 2**20} MiB")
    except RecursionError:
        outcome = ("refused", "it recursed without end")
    except Exception as error:  # TemplateError, the template's own raise_exception, an overflow...
        outcome = ("refused", f"{type(error).__name__}: {error}")
    connection.send(outcome)


def render_prompt(llama, messages: list[dict[str, str]], template: str) -> str:
    """The conversation as the model was trained to read it, ending where the assistant answers."""
    context = _render_context()
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_render_child, daemon=True, args=(
        sender, template, messages, _special_text(llama, llama.token_eos()), _special_text(llama, llama.token_bos())))
    child.start()
    sender.close()
    try:
        if not receiver.poll(RENDER_SECONDS):
            kind, text = "refused", f"it did not finish within {RENDER_SECONDS:g} s"
        else:
            kind, text = receiver.recv()
    except EOFError:  # the child died without a word
        child.join(1)
        kind, text = "refused", f"its process ended without an answer (exit code {child.exitcode})"
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join()
    if kind != "prompt":
        raise UserError(422, f"The chat template could not render this conversation: {text}", code="bad_chat_template")
    return text


def stream_answer(llama, prompt: str, sampling: Sampling, stopped: Callable[[], bool]) -> Iterator[dict[str, Any]]:
    """Yields {"text": piece} as tokens come, then one {"finish_reason": "stop"|"length"|"stopped"}."""
    # The template renders the special tokens (BOS included when the model wants one) as text.
    tokens = llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
    room = llama.n_ctx() - len(tokens)
    if room < 1:
        raise UserError(413, f"The conversation is {len(tokens)} tokens long and the model reads at most "
                             f"{llama.n_ctx()}: start a new chat or shorten it.", code="context_full")
    stream = llama.create_completion(tokens, max_tokens=min(sampling.max_tokens, room),
                                     temperature=sampling.temperature, top_p=sampling.top_p,
                                     stop=sampling.stop or None, stream=True)
    finish = "stop"
    try:
        for chunk in stream:
            if stopped():
                finish = "stopped"
                break
            choice = chunk["choices"][0]
            if choice["text"]:
                yield {"text": choice["text"]}
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    finally:
        stream.close()
    yield {"finish_reason": finish}
