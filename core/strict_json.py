"""JSON as the studio stores it: no NaN or Infinity (JSON has neither; Python's parser lets them in,
and 1e400 becomes Infinity), no nesting too deep to walk, and no text a database cannot hold or a
JSON answer cannot encode (NUL, which PostgreSQL refuses; lone surrogates, which are not UTF-8).
The API refuses such bodies at its edge; dataset files drop such rows."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any


class UnstorableJson(ValueError):
    """JSON that parses in Python but could not be stored or answered; the message says why in words."""


def _refuse_constant(name: str) -> float:
    raise UnstorableJson(f"{name} is not a number JSON allows; give a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise UnstorableJson(f"{text[:40]} is too large for a number here; give a finite number")
    return value


def unstorable_text_reason(text: str) -> str | None:
    """Why a string cannot be stored as text, or None when it can."""
    if "\x00" in text:
        return "holds a NUL character (\\u0000), which text here may not contain"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate (\\ud800-\\udfff), which is not a character"
    return None


def check_strings(value: Any) -> None:
    """Raises UnstorableJson where a string in value (keys too, at any depth) cannot be stored as text."""
    pending = [value]
    while pending:  # iterative: the depth was bounded by the parser, but a walk needs no stack either
        item = pending.pop()
        if isinstance(item, str):
            reason = unstorable_text_reason(item)
            if reason:
                raise UnstorableJson(f"A text value {reason}")
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set)):  # (YAML makes sets and tuples too)
            pending.extend(item)


def loads(text: str | bytes, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """json.loads that raises UnstorableJson for NaN, Infinity, numbers out of float's range, nesting
    deeper than Python's parser can follow, NUL characters and lone surrogates; json.JSONDecodeError
    for text that is not JSON. `object_pairs_hook` as json.loads' (it must return a dict)."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite,
                           object_pairs_hook=object_pairs_hook)
    except (json.JSONDecodeError, UnicodeDecodeError, UnstorableJson):
        raise
    except RecursionError:
        raise UnstorableJson("The JSON is nested too deeply to read; flatten it") from None
    except ValueError as error:  # an integer of more digits than Python converts
        raise UnstorableJson(f"A number in the JSON cannot be read: {error}") from None
    check_strings(value)
    return value
