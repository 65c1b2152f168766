"""A job's chat template is its owner's program: the playground renders it in a child process with a time
and a memory limit, so a hostile or broken template is refused in words and the API keeps its memory and
its threads (real llama.cpp load of the shipped SmolLM2 GGUF)."""
from __future__ import annotations

import time

import psutil
import pytest

from lanner.core.errors import UserError
from lanner.inference import generation
from lanner.inference.generation import chat_template, load_llama, render_prompt

pytestmark = pytest.mark.timeout(120)
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def llama():
    from lanner.core.default_model import gguf_path

    return load_llama(gguf_path())


def test_the_models_own_template_renders_as_before(llama):
    prompt = render_prompt(llama, CHAT, chat_template(llama, None))
    assert "What is 2 + 2?" in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert render_prompt(llama, CHAT, "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}") == \
        llama.detokenize([llama.token_bos()], special=True).decode() + "What is 2 + 2?"


@pytest.mark.parametrize("template, why", [
    ("{{ 'x' * 100000 * 100000 }}", "MiB"),                                     # a 10 GB string
    ("{{ 'x' * 100000 * 200 }}", "characters"),                                 # 20 MB: no context holds it
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursed"),
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),  # the template's own refusal
    ("{% for m in messages %}{{ m.content }}", "TemplateSyntaxError"),
])
def test_a_bad_template_is_refused_in_words_and_the_api_keeps_its_memory(llama, template, why):
    before = psutil.Process().memory_info().rss
    with pytest.raises(UserError) as refused:
        render_prompt(llama, CHAT, template)
    assert refused.value.status == 422 and refused.value.code == "bad_chat_template"
    assert why in refused.value.message
    assert psutil.Process().memory_info().rss - before < 256 * 2**20


def test_an_endless_template_is_stopped_at_its_time_limit(llama, monkeypatch):
    monkeypatch.setattr(generation, "RENDER_SECONDS", 1.0)
    render_prompt(llama, CHAT, chat_template(llama, None))  # the forkserver is up
    processes = {child.pid for child in psutil.Process().children(recursive=True)}
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    started = time.monotonic()
    with pytest.raises(UserError, match="did not finish within 1 s"):
        render_prompt(llama, CHAT, endless)
    assert time.monotonic() - started < 5
    assert {child.pid for child in psutil.Process().children(recursive=True)} == processes  # its process is gone
