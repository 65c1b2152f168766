"""The built-in reward functions: pure, one reward per completion (a float, or None when the row
gives nothing to judge by, e.g. no reference answer). Imported by the spec (their names) and by the
sandbox's child process, which runs every function of a job, built-ins included: a user's regex
may backtrack for ever, and the sandbox's timeout is what stops it."""
from __future__ import annotations

import json
import math
import re
from typing import Any

BUILTIN_KINDS = ("exact_match", "numeric_match", "regex", "length_penalty", "json_schema")
NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
CODE_FENCE = re.compile(r"^```[\w-]*\s*\n?(.*?)\n?```$", re.DOTALL)
JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _normal(text: Any) -> str:
    return " ".join(str(text).split()).casefold()


def exact_match(completion: str, reference: Any) -> float | None:
    """1 when the completion is the reference, ignoring case and runs of whitespace; else 0."""
    if reference is None:
        return None
    return float(_normal(completion) == _normal(reference))


def last_number(text: str) -> float | None:
    found = NUMBER.findall(str(text))
    for candidate in reversed(found):
        try:
            return float(candidate.replace(",", ""))
        except ValueError:
            continue
    return None


def numeric_match(completion: str, reference: Any, tolerance: float) -> float | None:
    """1 when the completion's last number is the reference's within `tolerance` (absolute, or
    relative to the reference, whichever is larger); else 0."""
    expected = reference if isinstance(reference, (int, float)) and not isinstance(reference, bool) \
        else last_number(reference) if reference is not None else None
    if expected is None:
        return None
    given = last_number(completion)
    if given is None:
        return 0.0
    return float(abs(given - expected) <= max(tolerance, tolerance * abs(expected)))


def regex_match(completion: str, pattern: str) -> float:
    """1 when the pattern matches anywhere in the completion (dot matches newlines; anchor with ^ $)."""
    return float(re.search(pattern, completion, re.DOTALL) is not None)


def length_penalty(completion: str, max_chars: int) -> float:
    """0 up to max_chars characters, then down linearly to -1 at twice that, -1 beyond."""
    over = len(completion) - max_chars
    return 0.0 if over <= 0 else -min(1.0, over / max_chars)


def json_schema_check(completion: str, schema: dict) -> float:
    """1 when the completion (or the one code block it is) is JSON that fits the schema, 0.5 when
    it is JSON that does not, 0 when it is not JSON. The schema is a small subset of JSON Schema:
    type, properties, required, items, enum, additionalProperties: false."""
    text = completion.strip()
    fenced = CODE_FENCE.match(text)
    try:
        value = json.loads(fenced.group(1) if fenced else text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than a parser can follow
        return 0.0
    return 1.0 if schema_problem(value, schema) is None else 0.5


def schema_shape_problem(schema: Any) -> str | None:
    """Why a json_schema reward's schema is not one schema_problem reads, or None: each keyword of the
    subset with a value of its kind (a list of names for required, a schema for each property, ...), so
    that a malformed one is refused when the job is queued, not a failure of every batch."""
    stack: list[tuple[Any, str]] = [(schema, "json_schema")]
    while stack:
        node, where = stack.pop()
        if not isinstance(node, dict):
            return f"{where} is not a schema (an object)"
        kind = node.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if kind is not None and not all(isinstance(one, str) for one in kinds):
            names = ", ".join([*JSON_TYPES, "number", "integer"])
            return f"{where}.type must be a type's name ({names}) or a list of them"
        if "enum" in node and not isinstance(node["enum"], list):
            return f"{where}.enum must be a list of values"
        required = node.get("required", [])
        if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
            return f"{where}.required must be a list of property names"
        properties = node.get("properties", {})
        if not isinstance(properties, dict):
            return f"{where}.properties must be an object of property names to schemas"
        stack.extend((item, f"{where}.properties.{name}") for name, item in properties.items())
        if isinstance(node.get("items"), dict):
            stack.append((node["items"], f"{where}.items"))
    return None


def schema_problem(value: Any, schema: dict, where: str = "$") -> str | None:
    """Why the value does not fit the schema, or None."""
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        return f"{where} is not {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} is not one of {schema['enum']}"
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                return f"{where} lacks {name!r}"
        properties = schema.get("properties", {})
        for name, item in value.items():
            if name in properties:
                if problem := schema_problem(item, properties[name], f"{where}.{name}"):
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{where} has {name!r}, which the schema does not allow"
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            if problem := schema_problem(item, schema["items"], f"{where}[{index}]"):
                return problem
    return None


def _is_type(value: Any, kind: str | list) -> bool:
    if isinstance(kind, list):
        return any(_is_type(value, one) for one in kind)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, JSON_TYPES.get(kind, object)) and not (kind != "boolean" and isinstance(value, bool))


def score_builtin(function: dict, completions: list[str], columns: dict[str, list]) -> list[float | None]:
    """A built-in function (a spec's RewardFunction as a dict) on a batch."""
    kind = function["kind"]
    if kind in ("exact_match", "numeric_match"):
        references = columns.get(function["column"]) or [None] * len(completions)
        if kind == "exact_match":
            return [exact_match(c, r) for c, r in zip(completions, references)]
        return [numeric_match(c, r, function["tolerance"]) for c, r in zip(completions, references)]
    if kind == "regex":
        return [regex_match(c, function["pattern"]) for c in completions]
    if kind == "length_penalty":
        return [length_penalty(c, function["max_chars"]) for c in completions]
    if kind == "json_schema":
        return [json_schema_check(c, function["json_schema"]) for c in completions]
    raise ValueError(f"no built-in reward function {kind!r}")
