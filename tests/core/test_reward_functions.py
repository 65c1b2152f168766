"""GRPO's reward functions: the built-ins (pure) and the sandbox that runs a job's functions."""
from __future__ import annotations

import pytest

from lanner.core.rewards.builtin import (exact_match, json_schema_check, length_penalty, numeric_match, regex_match,
                                         score_builtin)
from lanner.core.rewards.sandbox import RewardFunctionFailed, SandboxLimits, run_reward_functions

QUICK = SandboxLimits(timeout_s=3, memory_mib=512)


def test_exact_and_numeric_match_against_the_reference():
    assert exact_match("  Paris\n", "paris") == 1.0 and exact_match("Paris, France", "Paris") == 0.0
    assert exact_match("anything", None) is None
    assert numeric_match("so the total is 1,234.", "1234", 1e-6) == 1.0
    assert numeric_match("3 apples, then 5", 5, 1e-6) == 1.0 and numeric_match("about 4.9", 5, 1e-6) == 0.0
    assert numeric_match("about 4.9", 5, 0.05) == 1.0
    assert numeric_match("no number", "7", 1e-6) == 0.0 and numeric_match("7", None, 1e-6) is None


def test_regex_length_and_json_checks():
    assert regex_match("<think>a\nb</think> 4", r"^<think>.*</think>") == 1.0
    assert regex_match("4", r"^<think>") == 0.0
    assert [length_penalty("x" * n, 10) for n in (5, 10, 15, 20, 40)] == [0.0, 0.0, -0.5, -1.0, -1.0]
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}},
              "additionalProperties": False}
    assert json_schema_check('```json\n{"n": 3}\n```', schema) == 1.0
    assert json_schema_check('{"n": "3"}', schema) == 0.5 and json_schema_check('{"n": 3, "m": 1}', schema) == 0.5
    assert json_schema_check("n = 3", schema) == 0.0


def test_a_builtin_reads_its_reference_column():
    function = {"kind": "exact_match", "column": "gold"}
    assert score_builtin(function, ["a", "b"], {"gold": ["a", "a"]}) == [1.0, 0.0]


def python(source: str, name: str = "mine") -> dict:
    return {"kind": "python", "name": name, "source": source}


def test_the_sandbox_runs_builtins_and_user_code_with_the_rows_columns():
    user = python("def reward(prompts, completions, answer, **columns):\n"
                  "    print('scored', len(completions))\n"
                  "    return [1.0 if c.endswith(a) else None for c, a in zip(completions, answer)]\n")
    rewards = run_reward_functions([user, {"kind": "regex", "pattern": "^4"}], ["p", "q"], ["4", "5"],
                                   {"answer": ["4", "4"]}, QUICK)
    assert rewards == [[1.0, None], [1.0, 0.0]]


def failure(source: str, limits: SandboxLimits = QUICK) -> RewardFunctionFailed:
    with pytest.raises(RewardFunctionFailed) as caught:
        run_reward_functions([python(source)], ["p"], ["c"], {}, limits)
    assert caught.value.function == "mine"
    return caught.value


def test_an_exception_comes_back_with_the_users_traceback():
    error = failure("def helper(x):\n    return x['missing']\n\ndef reward(prompts, completions, **c):\n"
                    "    return [helper({}) for _ in completions]\n")
    assert error.message == "KeyError: 'missing'"
    assert 'File "<reward mine>", line 2, in helper' in error.traceback and "sandbox_child" not in error.traceback


@pytest.mark.parametrize("value", ["float('nan')", "1e30", "-10 ** 7", "True", "'1'"])
def test_a_reward_that_is_not_a_bounded_number_is_refused_in_words(value):
    error = failure(f"def reward(prompts, completions, **c):\n    return [{value} for _ in completions]\n")
    assert error.message == f"TypeError: reward returned {eval(value)!r} for completion 0; rewards are numbers " \
                            "within ±1e+06 (or None)"


def test_a_function_that_never_returns_is_stopped_by_the_timeout():
    error = failure("def reward(prompts, completions, **c):\n    while True:\n        pass\n",
                    SandboxLimits(timeout_s=1))
    assert "stopped after 1 s" in error.message


def test_a_function_that_allocates_too_much_is_stopped():
    error = failure("def reward(prompts, completions, **c):\n    block = bytearray(2 * 2**30)\n    return [1.0]\n")
    assert error.message.startswith("MemoryError")


def test_secrets_of_the_parents_environment_are_not_inherited(monkeypatch):
    monkeypatch.setenv("LANNER_SECRET_KEY", "s3cret")
    rewards = run_reward_functions([python(
        "import os\ndef reward(prompts, completions, **c):\n"
        "    return [float('s3cret' in repr(dict(os.environ)))] * len(completions)\n")], ["p"], ["c"], {}, QUICK)
    assert rewards == [[0.0]]


def test_network_and_writes_outside_the_working_directory_are_refused():
    error = failure("import socket\ndef reward(prompts, completions, **c):\n"
                    "    socket.create_connection(('127.0.0.1', 5432), timeout=2)\n")
    assert error.message.startswith(("PermissionError", "OSError"))
    error = failure("def reward(prompts, completions, **c):\n    open('/tmp/lanner-reward-escape', 'w')\n")
    assert "refuses writing '/tmp/lanner-reward-escape'" in error.message
    assert run_reward_functions([python("def reward(prompts, completions, **c):\n"
                                        "    open('scratch.txt', 'w').write('ok')\n    return [1.0]\n")],
                                ["p"], ["c"], {}, QUICK) == [[1.0]]
