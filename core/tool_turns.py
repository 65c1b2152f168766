"""Whether a chat template renders a conversation's tool calls and tools' answers: one written for plain chat
(SmolLM2's) leaves them out of its text, and a row trained so would teach empty turns. The training process
leaves such rows out (worker/training/common.py) and the dataset preview says so (backend/dataset_preview.py)."""
from __future__ import annotations

LEFT_OUT = ("it leaves tool calls or a tool's answers out of the text (a template for plain chat): give one that "
            "renders them (chat_template)")
_MARKER = "lanner-tool-turn"


def has_tool_turns(conversation: list[dict]) -> bool:
    return any("tool_calls" in message or message["role"] == "tool" for message in conversation)


def left_out(tokenizer, conversation: list[dict], tools: list[dict] | None) -> str | None:
    """LEFT_OUT where the chat template leaves a tool call or a tool's answer of `conversation` out of its text
    (each is replaced by a marker, which the text must show as often); None where it leaves none out."""
    if not has_tool_turns(conversation):
        return None
    probe = [{**message, "tool_calls": [{"type": "function", "function": {"name": _MARKER, "arguments": {}}}
                                        for _ in message["tool_calls"]]} if "tool_calls" in message
             else {**message, "content": _MARKER} if message["role"] == "tool" else message
             for message in conversation]
    wanted = sum(len(message.get("tool_calls", ())) + (message["role"] == "tool") for message in conversation)
    shown = tokenizer.apply_chat_template(probe, tokenize=False, tools=tools).count(_MARKER)
    return LEFT_OUT if shown < wanted else None
