"""Dataset files of every supported type and format: detected, normalised, bad rows reported with
their line and reason, and empty or unusable files refused with a clear error."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lanner.core.dataset_formats import DatasetError, examine_lines, inspect_dataset, load_rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


ASSISTANT = {"role": "assistant", "content": "Paris."}
USER = {"role": "user", "content": "Capital of France?"}

EXAMPLES = {
    "alpaca": ({"instruction": "Capital of France?", "input": "", "output": "Paris."},
               {"prompt": [USER], "completion": [ASSISTANT]}),
    "sharegpt": ({"conversations": [{"from": "human", "value": "Capital of France?"}, {"from": "gpt", "value": "Paris."}]},
                 {"prompt": [USER], "completion": [ASSISTANT]}),
    "messages": ({"messages": [USER, ASSISTANT]}, {"prompt": [USER], "completion": [ASSISTANT]}),
    "prompt_completion": ({"prompt": "Capital of France?", "completion": "Paris."},
                          {"prompt": [USER], "completion": [ASSISTANT]}),
    "text": ({"text": "Paris is the capital of France."}, {"text": "Paris is the capital of France."}),
    "preference": ({"prompt": "Capital of France?", "chosen": "Paris.", "rejected": "Lyon."},
                   {"prompt": [USER], "chosen": [ASSISTANT], "rejected": [{"role": "assistant", "content": "Lyon."}]}),
    "kto": ({"prompt": "Capital of France?", "completion": "Paris.", "label": True},
            {"prompt": [USER], "completion": [ASSISTANT], "label": True}),
    "prompt": ({"prompt": "Capital of France?", "answer": "Paris", "level": 1}, {"prompt": [USER], "answer": "Paris", "level": 1}),
}


def test_conversations_ending_with_the_users_turn_are_prompts(tmp_path):
    path = write_jsonl(tmp_path / "ask.jsonl", [{"messages": [USER], "answer": "Paris"},
                                                {"messages": [USER, ASSISTANT, USER], "answer": "Paris"},
                                                {"prompt": [USER, ASSISTANT], "answer": "Paris"}])
    fmt, rows, bad = load_rows(path)
    assert (fmt, rows[0]) == ("prompt", {"prompt": [USER], "answer": "Paris"})
    assert rows[1]["prompt"] == [USER, ASSISTANT, USER] and len(rows) == 2
    assert "'prompt' ends with the assistant's message; a prompt to answer ends with the user's" in bad[0]["reason"]


@pytest.mark.parametrize("fmt", sorted(EXAMPLES))
def test_each_format_is_detected_and_normalised(tmp_path, fmt):
    raw, canonical = EXAMPLES[fmt]
    path = write_jsonl(tmp_path / "data.jsonl", [raw, raw])
    report = inspect_dataset(path)
    assert report["format"] == fmt
    assert (report["rows"], report["usable_rows"], report["bad_rows"], report["bad_row_count"]) == (2, 2, [], 0)
    assert report["columns"] == sorted(raw)
    assert load_rows(path) == (fmt, [canonical, canonical], [])


def test_alpaca_input_and_multi_turn_conversations(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [
        {"instruction": "Translate.", "input": "bonjour", "output": "hello", "system": "Be brief."}])
    assert load_rows(path)[1] == [{"prompt": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Translate.\n\nbonjour"}],
                                   "completion": [{"role": "assistant", "content": "hello"}]}]
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turns}])
    assert load_rows(path)[1] == [{"prompt": turns[:3], "completion": turns[3:]}]


def test_broken_rows_are_reported_with_line_and_reason(tmp_path):
    good = {"instruction": "Say hi.", "output": "Hi!"}
    path = write_jsonl(tmp_path / "data.jsonl", [
        good,                                     # 1
        '{"instruction": "unterminated',          # 2
        {"instruction": "No answer."},            # 3
        good,                                     # 4
        "[1, 2]",                                 # 5
        {"instruction": "Blank.", "output": " "},  # 6
        {"instruction": 7, "output": "x"},        # 7
    ])
    report = inspect_dataset(path)
    assert (report["format"], report["rows"], report["usable_rows"], report["bad_row_count"]) == ("alpaca", 7, 2, 5)
    assert {item["line"]: item["reason"] for item in report["bad_rows"]} == {
        2: "malformed JSON: Unterminated string starting at column 17",  # Python's "starting at" completed once
        3: "missing 'output'",
        5: "a list, not an object with fields",
        6: "'output' is blank (only whitespace)",
        7: "'instruction' is a number, not text",
    }
    fmt, rows, bad = load_rows(path)
    assert len(rows) == 2 and [item["line"] for item in bad] == [2, 3, 5, 6, 7]


def test_conversation_problems_are_explained(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [
        {"messages": [USER, ASSISTANT]},
        {"messages": [USER]},
        {"messages": [{"role": "wizard", "content": "hi"}, ASSISTANT]},
        {"messages": "not a list"},
        {"messages": [ASSISTANT]},
    ])
    reasons = [item["reason"] for item in inspect_dataset(path)["bad_rows"]]
    assert "no assistant message" in reasons[0]
    assert "'wizard'" in reasons[1]
    assert reasons[2] == "'messages' is text, not a list of messages"
    assert "nothing prompts it" in reasons[3]


def test_empty_and_unusable_datasets_fail_clearly(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DatasetError, match="empty"):
        inspect_dataset(empty)
    with pytest.raises(DatasetError, match="empty"):
        load_rows(empty)

    all_bad = write_jsonl(tmp_path / "bad.jsonl", [{"instruction": "x"}, {"instruction": "y", "output": ""}])
    with pytest.raises(DatasetError, match="none of its 2 rows can be used") as caught:
        load_rows(all_bad)
    assert caught.value.report["bad_row_count"] == 2 and caught.value.report["usable_rows"] == 0

    unknown = write_jsonl(tmp_path / "unknown.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(DatasetError, match="no known format.*answer, question"):
        inspect_dataset(unknown)

    garbage = write_jsonl(tmp_path / "garbage.jsonl", ["{oops", "nope"])
    with pytest.raises(DatasetError, match="none of its 2 rows can be read") as caught:
        inspect_dataset(garbage)
    assert [item["line"] for item in caught.value.report["bad_rows"]] == [1, 2]

    # not one row readable: the message says why (not that "(none)" of the fields matches a format)
    unreadable = tmp_path / "unreadable.jsonl"
    unreadable.write_bytes(b'{"text": "a", "score": NaN}\n\n{"text": "\xed\xa0\x80"}\n')
    with pytest.raises(DatasetError, match=r"rows can be read \(line 1: NaN .*; line 3: not UTF-8") as caught:
        inspect_dataset(unreadable)
    assert "no known format" not in str(caught.value)

    wide = tmp_path / "wide.csv"
    wide.write_text(",".join(f"c{i}" for i in range(5000)) + "\n" + ",".join("v" * 5000) + "\n")
    with pytest.raises(DatasetError, match="no known format.* and 4,980 more") as caught:
        inspect_dataset(wide)
    assert len(str(caught.value)) < 2000 and len(caught.value.report["columns"]) == 5000

    with pytest.raises(DatasetError, match="unsupported file type .txt"):
        inspect_dataset(tmp_path / "data.txt")


def test_encodings(tmp_path):
    row = {"instruction": "Café?", "output": "Oui, café."}
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(row, ensure_ascii=False).encode() + b"\n")
    assert inspect_dataset(bom)["usable_rows"] == 1
    utf16 = tmp_path / "utf16.jsonl"
    utf16.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-16")
    assert load_rows(utf16)[1][0]["prompt"][0]["content"] == "Café?"

    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(json.dumps(row, ensure_ascii=False).encode() + b"\n" +
                       json.dumps(row, ensure_ascii=False).encode("latin-1") + b"\n")
    report = inspect_dataset(latin1)
    assert report["usable_rows"] == 1
    assert report["bad_rows"] == [{"line": 2, "reason": "not UTF-8 text (byte 0xe9 at column 21)"}]

    latin1_csv = tmp_path / "latin1.csv"
    latin1_csv.write_bytes("instruction,output\nhi,ok\nCafé?,oui\n".encode("latin-1"))
    with pytest.raises(DatasetError, match="not UTF-8 text: byte 0xe9 on line 3"):
        inspect_dataset(latin1_csv)


def test_json_csv_and_parquet(tmp_path):
    rows = [{"prompt": "Capital of France?", "completion": "Paris."}, {"prompt": "", "completion": "x"},
            {"prompt": "2+2?", "completion": "4"}]
    as_json = tmp_path / "data.json"
    as_json.write_text(json.dumps(rows, indent=2))
    report = inspect_dataset(as_json)
    assert (report["format"], report["usable_rows"]) == ("prompt_completion", 2)
    # The bad row is the second element, which starts on line 6 of the indented file.
    assert report["bad_rows"] == [{"line": 6, "reason": "'prompt' is empty"}]

    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"data": rows}))
    assert inspect_dataset(wrapped)["usable_rows"] == 2

    broken = tmp_path / "broken.json"
    broken.write_text('[{"prompt": "a",\n "completion": }]')
    with pytest.raises(DatasetError, match="not valid JSON.*line 2"):
        inspect_dataset(broken)

    as_csv = tmp_path / "data.csv"
    with as_csv.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["prompt", "completion"])
        writer.writerows([[row["prompt"], row["completion"]] for row in rows])
        writer.writerow(["a", "b", "extra"])
    report = inspect_dataset(as_csv)
    assert (report["format"], report["rows"], report["usable_rows"]) == ("prompt_completion", 4, 2)
    assert [item["line"] for item in report["bad_rows"]] == [3, 5]

    chats = tmp_path / "chats.csv"
    with chats.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["messages"])
        writer.writerow([json.dumps([USER, ASSISTANT])])
    assert load_rows(chats)[1] == [{"prompt": [USER], "completion": [ASSISTANT]}]

    as_parquet = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), as_parquet)
    report = inspect_dataset(as_parquet)
    assert (report["usable_rows"], report["bad_rows"]) == (2, [{"line": 2, "reason": "'prompt' is empty"}])
    assert report["numbered_by"] == "row"

    kto_csv = tmp_path / "kto.csv"
    kto_csv.write_text("prompt,completion,label\nq,a,true\nq,b,0\nq,c,maybe\n")
    fmt, kto_rows, bad = load_rows(kto_csv)
    assert fmt == "kto" and [row["label"] for row in kto_rows] == [True, False]
    assert bad == [{"line": 4, "reason": "'label' is 'maybe'; expected true or false"}]

    not_parquet = tmp_path / "fake.parquet"
    not_parquet.write_text("hello")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        inspect_dataset(not_parquet)


ALPACA = json.dumps({"instruction": "Say hi.", "output": "Hi!"})


def accounted(report: dict) -> bool:
    return report["rows"] == report["usable_rows"] + report["bad_row_count"]


def test_every_line_of_a_jsonl_file_is_a_usable_row_or_a_reported_one(tmp_path):
    """A blank line (only a carriage return, only whitespace, or empty, at the end too) is a row
    named by its line, never skipped: a 50-line file reports 50 rows."""
    lines = [ALPACA] * 50
    lines[9], lines[19], lines[29] = "\r", " \t ", ""
    path = tmp_path / "data.jsonl"
    path.write_bytes(("\n".join(lines) + "\n\n").encode())  # ...and one blank line at the end: 51 lines
    report = inspect_dataset(path)
    assert (report["rows"], report["usable_rows"], report["bad_row_count"]) == (51, 47, 4) and accounted(report)
    assert report["bad_rows"] == [{"line": n, "reason": "blank line"} for n in (10, 20, 30, 51)]

    crlf = tmp_path / "crlf.jsonl"  # CRLF line ends, a BOM, trailing spaces: the same rows, the same lines
    crlf.write_bytes(b"\xef\xbb\xbf" + (ALPACA + "  \r\n\r\n" + ALPACA + "\r\n").encode())
    report = inspect_dataset(crlf)
    assert (report["rows"], report["usable_rows"], report["bad_rows"]) == (3, 2, [{"line": 2, "reason": "blank line"}])
    with pytest.raises(DatasetError, match="is empty: it has no rows, only 3 blank lines"):
        inspect_dataset(write_jsonl(tmp_path / "blank.jsonl", ["\r", " ", ""]))
    old_mac = tmp_path / "mac.jsonl"  # lines that end in a carriage return alone
    old_mac.write_bytes((ALPACA + "\r\r" + ALPACA + "\r").encode())
    report = inspect_dataset(old_mac)
    assert (report["rows"], report["usable_rows"], report["bad_rows"]) == (3, 2, [{"line": 2, "reason": "blank line"}])
    assert "carriage return alone" in report["notes"][0]


def test_a_bad_row_names_every_problem(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [
        {"instruction": "Say hi.", "output": "Hi!"},
        {"instruction": 7},
        {"instruction": None, "output": ["Hi"], "input": 3},
    ])
    reasons = {item["line"]: item["reason"] for item in inspect_dataset(path)["bad_rows"]}
    assert reasons == {
        2: "'instruction' is a number, not text; missing 'output'",
        3: "'instruction' is null; 'input' is a number, not text; 'output' is a list, not text",
    }
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [USER, ASSISTANT]},
                                                 {"messages": [{"role": "wizard", "content": 1}, {"content": "x"}]}])
    assert inspect_dataset(chat)["bad_rows"] == [{"line": 2, "reason": (
        "messages[0] has role 'wizard'; expected one of assistant, system, tool, user; messages[0]'s 'content' is a "
        "number, not text; messages[1] has no 'role'")}]


def test_keys_that_differ_from_a_field_only_in_case_or_spaces_are_named(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", [
        {"instruction": "Translate.", "Input": "bonjour", "output": "hello"},     # usable; 'Input' ignored
        {"instruction": "Say hi.", " output": "Hi!"},                             # no 'output'
        {"instruction": "Say hi.", "output": "Hi!", "Output ": "Ho!"},           # usable; 'Output ' ignored
        {"messages": "x"},
    ])
    report = inspect_dataset(path)
    assert report["usable_rows"] == 2 and report["warning_count"] == 2
    assert report["warnings"] == [
        {"line": 1, "message": "key 'Input' looks like 'input' and was ignored: field names must match exactly"},
        {"line": 3, "message": "key 'Output ' looks like 'output' and was ignored: field names must match exactly"}]
    assert {item["line"]: item["reason"] for item in report["bad_rows"]}[2] == (
        "missing 'output' (it has ' output': field names must match exactly, case and spaces included)")
    assert load_rows(path)[1][0]["prompt"] == [{"role": "user", "content": "Translate."}]

    capitalised = write_jsonl(tmp_path / "capitalised.jsonl", [{"Instruction": "a", "Output": "b"}])
    with pytest.raises(DatasetError, match="'Instruction' looks like 'instruction', 'Output' looks like 'output'"):
        inspect_dataset(capitalised)
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"Role": "user", "content": "a"}, ASSISTANT]}])
    with pytest.raises(DatasetError, match=r"messages\[0\] has no 'role' \(it has 'Role'"):
        inspect_dataset(chat)


def test_json_errors_read_once_and_name_their_line(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('[{"prompt": "a",\n "completion": "unterminated}]')
    with pytest.raises(DatasetError) as caught:
        inspect_dataset(broken)
    assert str(caught.value) == "broken.json is not valid JSON: Unterminated string starting at line 2, column 16."


def test_json_arrays_and_json_lines_are_read_whatever_their_extension(tmp_path):
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c"}, {"prompt": "d", "completion": "e"}]
    array = tmp_path / "array.jsonl"
    array.write_text(json.dumps(rows, indent=1))
    report, numbered = examine_lines(array)
    assert (report["rows"], report["usable_rows"]) == (3, 2) and "read as JSON" in report["notes"][0]
    assert report["bad_rows"] == [{"line": 6, "reason": "missing 'completion'"}]
    assert [line for line, _ in numbered] == [2, 9]

    lines = tmp_path / "lines.json"
    lines.write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    report = inspect_dataset(lines)
    assert (report["rows"], report["usable_rows"], report["bad_row_count"]) == (4, 2, 2) and accounted(report)
    assert "read as .jsonl" in report["notes"][0]

    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text('{"name": "x", "meta": {"rows": [1]},\n "data": [\n{"prompt": "a", "completion": "b"},\n\n  7]}')
    report, numbered = examine_lines(wrapped)
    assert numbered[0][0] == 3 and report["bad_rows"] == [{"line": 5, "reason": "a number, not an object with fields"}]


def test_every_csv_record_is_accounted_for(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(b"\xef\xbb\xbfinstruction,output\r\nhi,ok\r\n\r\n,\r\n\"multi\r\nline\",ok\r\n   \r\nyo,\r\nlast,ok\r\n\r\n")
    report, numbered = examine_lines(path)
    assert accounted(report) and (report["rows"], report["usable_rows"]) == (8, 3)
    assert report["bad_rows"] == [{"line": 3, "reason": "blank line"}, {"line": 4, "reason": "every cell is empty"},
                                  {"line": 7, "reason": "blank line"}, {"line": 8, "reason": "'output' is empty"},
                                  {"line": 10, "reason": "blank line"}]
    assert [line for line, _ in numbered] == [2, 5, 9]
    assert numbered[1][1]["prompt"][0]["content"] == "multi\r\nline"

    repeated = tmp_path / "repeated.csv"
    repeated.write_text("text,text\na,b\n")
    report, numbered = examine_lines(repeated)
    assert numbered == [(2, {"text": "a"})] and "'text' more than once" in report["notes"][0]


def test_a_key_repeated_in_a_row_is_named_and_rows_on_one_line_are_numbered_by_place(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "first", "text": "second"}\n{"prompt": "x", "prompt": "y"}\n')
    report, numbered = examine_lines(path)
    assert numbered == [(1, {"text": "second"})]
    assert report["warnings"] == [
        {"line": 1, "message": "key 'text' appears more than once in one object: only its last value was read"}]
    assert report["bad_rows"] == [{"line": 2, "reason": (
        "missing 'text'; key 'prompt' appears more than once in one object: only its last value was read")}]

    one_line = tmp_path / "one_line.json"
    one_line.write_text('{"data": [{"text": "a"}, {"text": ""}, {"text": "b", "text": "c"}]}')
    report, numbered = examine_lines(one_line)
    assert report["numbered_by"] == "row" and "numbered by their place" in report["notes"][0]
    assert report["bad_rows"] == [{"line": 2, "reason": "'text' is empty"}]
    assert [line for line, _ in numbered] == [1, 3] and [item["line"] for item in report["warnings"]] == [3]


def test_conversations_written_in_the_other_conventions_are_read(tmp_path):
    # content as a list of text parts (OpenAI), ShareGPT's role names in "messages", {role, content} in
    # "conversations": read as the same conversation; a part that is not text is named
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Capital"},
                                                       {"type": "text", "text": "of France?"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]}]}
    named = {"messages": [{"role": "human", "content": "Capital of France?"}, {"role": "gpt", "content": "Paris."}]}
    image = {"messages": [{"role": "user", "content": [{"type": "image", "url": "map.png"}]}, ASSISTANT]}
    fmt, rows, bad = load_rows(write_jsonl(tmp_path / "chat.jsonl", [parts, named, image]))
    assert fmt == "messages" and rows[0] == {"prompt": [{"role": "user", "content": "Capital\nof France?"}],
                                             "completion": [ASSISTANT]}
    assert rows[1] == {"prompt": [USER], "completion": [ASSISTANT]}
    assert bad == [{"line": 3, "reason": "messages[0]'s 'content'[0] is a part of type 'image'; only text parts "
                                         "can be trained on"}]
    assert load_rows(write_jsonl(tmp_path / "sharegpt.jsonl", [{"conversations": [USER, ASSISTANT]}])) == \
        ("sharegpt", [{"prompt": [USER], "completion": [ASSISTANT]}], [])


def test_an_assistant_turn_marked_not_to_train_is_not_the_answer(tmp_path):
    good = {"role": "assistant", "content": "Paris.", "weight": 1}
    marked = [{"messages": [USER, good, {"role": "user", "content": "Sure?"}, {"role": "assistant", "content": "No.",
                                                                             "weight": 0}]},
              {"messages": [USER, {"role": "assistant", "content": "No.", "loss": False}]}]
    fmt, rows, bad = load_rows(write_jsonl(tmp_path / "chat.jsonl", marked))
    assert rows == [{"prompt": [USER], "completion": [ASSISTANT]}]
    assert bad == [{"line": 2, "reason": "'messages': every assistant message is marked not to be trained on "
                                         "(weight 0 or loss false)"}]


def test_text_of_invisible_characters_only_is_blank(tmp_path):
    path = write_jsonl(tmp_path / "text.jsonl", [{"text": "\u200b\ufeff \u200d"}, {"text": "Paris\u200b."},
                                                 {"messages": [USER, {"role": "assistant", "content": "\u200b"}]}])
    report = inspect_dataset(path)
    assert report["usable_rows"] == 1
    assert report["bad_rows"][0] == {"line": 1, "reason": "'text' is blank (only whitespace and invisible "
                                                          "characters such as zero-width spaces)"}


def test_answers_that_repeat_the_prompt_or_do_not_differ(tmp_path):
    # ultrafeedback_binarized writes chosen and rejected as whole conversations, the prompt's turn first:
    # trained as they stand the prompt would be read twice and learnt as part of the answer
    lyon = {"role": "assistant", "content": "Lyon."}
    rows = [{"prompt": "Capital of France?", "chosen": [USER, ASSISTANT], "rejected": [USER, lyon]},
            {"prompt": "Capital of France?", "chosen": "Paris.", "rejected": " Paris. "},
            {"prompt": "Capital of France?", "chosen": [{"role": "user", "content": "Of Italy?"}, ASSISTANT],
             "rejected": "Lyon."}]
    fmt, kept, bad = load_rows(write_jsonl(tmp_path / "pairs.jsonl", rows))
    assert kept == [{"prompt": [USER], "chosen": [ASSISTANT], "rejected": [lyon]}]
    assert bad == [{"line": 2, "reason": "'chosen' and 'rejected' are the same answer: the pair has nothing to prefer"},
                   {"line": 3, "reason": "'chosen' holds a user message after the prompt: an answer is the assistant's "
                                         "messages (or the whole conversation, starting with the prompt's messages)"}]


def test_conversations_that_call_tools(tmp_path):
    # OpenAI's shape (arguments as JSON text, content null beside the calls, a tool's answer, the tools' schemas)
    # becomes the chat templates' (arguments as objects); a call of another kind of message, or one whose
    # arguments are no object, is refused with its place
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ask = {"role": "user", "content": "Weather in Paris?"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": '{"celsius": 21}'}
    answer = {"role": "assistant", "content": "21 degrees."}
    called = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    rows = [{"messages": [ask, call, result, answer], "tools": [weather]},
            {"messages": [ask, call], "tools": json.dumps([weather])},
            {"messages": [{**ask, "tool_calls": call["tool_calls"]}, answer]},
            {"messages": [ask, {**call, "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}, {"type": "x"}]}]},
            {"messages": [ask, answer], "tools": "not json"}]
    fmt, kept, bad = load_rows(write_jsonl(tmp_path / "tools.jsonl", rows))
    assert fmt == "messages"
    assert kept == [{"prompt": [ask, called, {"role": "tool", "content": '{"celsius": 21}', "tool_call_id": "c1"}],
                     "completion": [answer], "tools": [weather]},
                    {"prompt": [ask], "completion": [called], "tools": [weather]}]
    assert bad == [
        {"line": 3, "reason": "messages[0] has tool calls but is not the assistant's message"},
        {"line": 4, "reason": "messages[1]'s tool_calls[0]'s arguments are not an object (or a JSON text of one); "
                              "messages[1]'s tool_calls[1] names no function"},
        {"line": 5, "reason": "'tools' is text that is not JSON"}]
    # LLaMA-Factory's ShareGPT: the call a "function_call" turn's JSON, the answer an "observation" turn
    function_call = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
    sharegpt = [{"conversations": [{"from": "human", "value": "Weather in Paris?"},
                                   {"from": "function_call", "value": function_call},
                                   {"from": "observation", "value": '{"celsius": 21}'},
                                   {"from": "gpt", "value": "21 degrees."}], "tools": json.dumps([weather])},
                {"conversations": [{"from": "human", "value": "Hi"}, {"from": "function_call", "value": "not json"}]}]
    fmt, kept, bad = load_rows(write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt))
    assert (fmt, kept) == ("sharegpt", [{"prompt": [ask, called, {"role": "tool", "content": '{"celsius": 21}'}],
                                         "completion": [answer], "tools": [weather]}])
    assert bad == [{"line": 2, "reason": "conversations[1]'s tool_calls[0] names no function"}]
    # the preference methods (and GRPO's prompts) do not take them
    pairs = [{"prompt": [ask, call, result], "chosen": [answer], "rejected": "Cold."}, {**EXAMPLES["preference"][0]}]
    assert load_rows(write_jsonl(tmp_path / "pairs.jsonl", pairs))[2] == [{"line": 1, "reason": (
        "tool calls and tools' answers are trained by supervised fine-tuning only (messages, ShareGPT or "
        "prompt/completion rows)")}]


def test_preference_pairs_without_a_prompt_take_the_turns_both_share_as_it(tmp_path):
    # Anthropic's HH-RLHF writes each answer as the whole "Human: / Assistant:" transcript, and chat datasets
    # the whole conversation: the prompt is the turns the two share (TRL's implicit prompt)
    lyon = {"role": "assistant", "content": "Lyon."}
    hello = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    rows = [{"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Capital of France?\n\nAssistant: Paris.",
             "rejected": "\n\nHuman: Hi\n\nAssistant: Hello!\n\nHuman: Capital of France?\n\nAssistant: Lyon."},
            {"chosen": [{"from": "human", "value": "Capital of France?"}, {"from": "gpt", "value": "Paris."}],
             "rejected": [USER, lyon]},
            {"chosen": "Paris.", "rejected": "Lyon."},
            {"chosen": "Human: Hi\n\nAssistant: Hello!", "rejected": "Human: Hi\n\nAssistant: Hello!\n\nHuman: "
                                                                     "Capital of France?\n\nAssistant: Lyon."},
            {"chosen": [ASSISTANT], "rejected": [lyon]},
            {"chosen": "Human: Hi\n\nAssistant:", "rejected": "Human: Hi\n\nAssistant: Hello!"},
            {"chosen": "Human: Hi", "rejected": "Human: Hi\n\nAssistant: Hello!"}]
    fmt, kept, bad = load_rows(write_jsonl(tmp_path / "hh.jsonl", rows))
    assert fmt == "preference"
    assert kept == [{"prompt": [*hello, USER], "chosen": [ASSISTANT], "rejected": [lyon]},
                    {"prompt": [USER], "chosen": [ASSISTANT], "rejected": [lyon]}]
    no_prompt = ("no 'prompt', and 'chosen' and 'rejected' share no turns to take as one: give a 'prompt', or write "
                 "both answers as the whole conversation (a list of messages, or a 'Human:' / 'Assistant:' transcript)")
    assert bad == [{"line": 3, "reason": no_prompt},
                   {"line": 4, "reason": "'rejected' holds a user message after the prompt: an answer is the "
                                         "assistant's messages (or the whole conversation, starting with the "
                                         "prompt's messages)"},
                   {"line": 5, "reason": no_prompt},
                   {"line": 6, "reason": "'chosen': the last assistant message is empty"},
                   {"line": 7, "reason": "'chosen' has no answer after the turns it shares with the other"}]


@pytest.mark.parametrize("mark, name", [(";", "semicolons"), ("\t", "tabs")])
def test_a_csv_separated_by_semicolons_or_tabs_is_read(tmp_path, mark, name):
    path = tmp_path / "data.csv"
    path.write_text(f"instruction{mark}output\nCapital of France?{mark}Paris.\n")
    report, rows = examine_lines(path)
    assert rows == [(2, {"prompt": [USER], "completion": [ASSISTANT]})]
    assert report["notes"] == [f"Its header has no comma but {name}: cells were read as separated by them."]


def test_a_byte_order_mark_past_the_first_line_is_read_past(tmp_path):
    # two UTF-8 files with byte order marks, joined with cat
    row = json.dumps({"messages": [USER, ASSISTANT]}).encode()
    path = tmp_path / "joined.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + row + b"\n\xef\xbb\xbf" + row + b"\n")
    report, rows = examine_lines(path)
    assert [line for line, _ in rows] == [1, 2] and report["bad_row_count"] == 0
    assert report["notes"] == ["1 line (first: line 2) starts with a byte order mark, as files joined together do: "
                               "it was read past."]
