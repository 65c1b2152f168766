"""An Ollama Modelfile beside a GGUF. For ChatML-style chat templates (<|im_start|>role ... <|im_end|>:
SmolLM2, Qwen2/2.5/3) the Jinja template is translated into Ollama's Go template, with the default
system prompt the Jinja one inserts; for other templates Ollama is left to read the template from
the GGUF's tokenizer.chat_template (it recognises the common ones), and only stop tokens are set: eos
and the template's end-of-turn marker (Gemma's <end_of_turn>, Llama 3's <|eot_id|>)."""
from __future__ import annotations

import re
from pathlib import Path

from .files import atomic_file

CHATML_TEMPLATE = (
    "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n"
)


TURN_END_MARKERS = ("<end_of_turn>", "<|eot_id|>")


def is_chatml(chat_template: str | None) -> bool:
    return bool(chat_template) and "<|im_start|>" in chat_template and "<|im_end|>" in chat_template


def default_system_prompt(chat_template: str) -> str | None:
    match = re.search(r"<\|im_start\|>system\n([^'\"{}<]+?)<\|im_end\|>", chat_template)
    return match.group(1).strip() if match else None


def _quote(text: str) -> str:
    return '"""' + text.replace('"""', '\\"\\"\\"') + '"""'


def modelfile_text(gguf_name: str, chat_template: str | None, stop_tokens: list[str]) -> str:
    lines = [f"FROM ./{gguf_name}", ""]
    if is_chatml(chat_template):
        lines.append(f"TEMPLATE {_quote(CHATML_TEMPLATE)}")
        system = default_system_prompt(chat_template)
        if system:
            lines.append(f"SYSTEM {_quote(system)}")
        stop_tokens = list(dict.fromkeys(["<|im_end|>", "<|im_start|>", *stop_tokens]))
    else:
        lines.append("# The chat template is in the GGUF metadata (tokenizer.chat_template).")
        # A turn ends on its marker, not on eos (Gemma ends each turn with <end_of_turn>).
        turn_ends = [marker for marker in TURN_END_MARKERS if chat_template and marker in chat_template]
        stop_tokens = list(dict.fromkeys([*turn_ends, *stop_tokens]))
    for token in stop_tokens:
        lines.append(f'PARAMETER stop "{token}"')
    return "\n".join(lines) + "\n"


def write_modelfile(gguf_path: Path, chat_template: str | None, stop_tokens: list[str],
                    out_path: Path | None = None) -> dict:
    gguf_path = Path(gguf_path)
    out_path = Path(out_path) if out_path else gguf_path.with_name("Modelfile")
    with atomic_file(out_path) as temp:
        temp.write_text(modelfile_text(gguf_path.name, chat_template, stop_tokens))
    return {"format": "ollama-modelfile", "path": str(out_path), "from": gguf_path.name,
            "bytes": out_path.stat().st_size, "chatml_template": is_chatml(chat_template)}
