"""Conversations that call tools: rendered through a chat template that knows tools, each call's arguments as
written (not given the other calls' keys as nulls, as an Arrow table of the rows would), the call trained on;
a template for plain chat refuses them in words instead of teaching empty turns."""
from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from lanner.worker.job_process import JobFailed
from lanner.worker.training.model import load_tokenizer
from lanner.worker.training.sft import build_trainer

from worker_helpers import training_options_of

# A template in the shape of Qwen's and Hermes': the tools' schemas first, each call as JSON
TOOLS_TEMPLATE = (
    "{% if tools %}tools: {% for tool in tools %}{{ tool | tojson }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}{{ m.role }}: {% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ "
    "{'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</call>{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {
    key: {"type": "string"}}}}} for name, key in (("get_weather", "city"), ("search", "query"))]


def conversation(name: str, arguments: dict) -> dict:
    return {"prompt": [{"role": "user", "content": f"Use {name}."}],
            "completion": [{"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": name, "arguments": arguments}}]}],
            "tools": TOOLS}


ROWS = [conversation("get_weather", {"city": "Paris"}), conversation("search", {"query": "x", "limit": 3}),
        {"prompt": [{"role": "user", "content": "Hi"}], "completion": [{"role": "assistant", "content": "Hello!"}]}]


def options(chat_template: str | None):
    return training_options_of("lora", {"chat_template": chat_template, "hyperparameters": {
        "max_seq_len": 512, "eval_fraction": 0, "before_after_eval": False}})


def test_tool_calls_are_rendered_as_written_and_trained(smollm2_dir, tmp_path):
    tokenizer = load_tokenizer(str(smollm2_dir), options(TOOLS_TEMPLATE))
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    trainer = build_trainer(model, tokenizer, ROWS * 2, options(TOOLS_TEMPLATE), str(tmp_path / "run"), [])
    rendered = {tokenizer.decode(ids): tokenizer.decode([i for i, label in zip(ids, labels) if label != -100])
                for ids, labels in zip(trainer.train_dataset["input_ids"], trainer.train_dataset["labels"])}
    tools = "tools: " + "".join(json.dumps(tool) for tool in TOOLS)
    for name, arguments in (("get_weather", {"city": "Paris"}), ("search", {"query": "x", "limit": 3})):
        call = "<call>" + json.dumps({"name": name, "arguments": arguments}) + "</call>"
        text = f"{tools}\nuser: Use {name}.\nassistant: {call}\n"
        assert text in rendered, list(rendered)
        assert call in rendered[text]  # the call is what the row trains
    assert "user: Hi\nassistant: Hello!\n" in rendered


def test_a_template_without_tools_refuses_the_rows_that_call_them(smollm2_dir):
    from lanner.worker.training.common import rows_the_template_takes

    tokenizer = load_tokenizer(str(smollm2_dir), options(None))  # SmolLM2's own: plain chat
    assert rows_the_template_takes(ROWS, tokenizer, []) == ROWS[2:]
    with pytest.raises(JobFailed, match="leaves tool calls or a tool's answers out of the text"):
        rows_the_template_takes(ROWS[:2], tokenizer, [])


def test_a_template_that_takes_one_call_a_turn_refuses_the_rows_with_two(smollm2_dir):
    # Llama 3.1's template raises on a turn with several calls: a row whose turn has two is left out, not the job
    from lanner.worker.training.common import rows_the_template_takes

    one_call = ("{% for m in messages %}{% if m.tool_calls and m.tool_calls | length > 1 %}{{ raise_exception("
                "'This model only supports single tool-calls at once!') }}{% endif %}{% endfor %}" + TOOLS_TEMPLATE)
    tokenizer = load_tokenizer(str(smollm2_dir), options(one_call))
    two = conversation("get_weather", {"city": "Paris"})
    two["completion"][0]["tool_calls"] *= 2
    assert rows_the_template_takes([ROWS[0], two, ROWS[1]], tokenizer, []) == [ROWS[0], ROWS[1]]


def test_the_before_and_after_samples_prompt_with_the_tools_and_compare_with_the_call(smollm2_dir):
    from lanner.worker.training.evaluation import _prompt_and_reference

    tokenizer = load_tokenizer(str(smollm2_dir), options(TOOLS_TEMPLATE))
    _, rendered, reference = _prompt_and_reference(ROWS[0], tokenizer)
    assert rendered.startswith("tools: ") and rendered.endswith("user: Use get_weather.\nassistant: ")
    assert json.loads(reference) == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
