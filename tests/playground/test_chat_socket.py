"""Chat over /ws/playground on the real app served by uvicorn: a fine-tuned job's GGUF (made by our
export pipeline) and the base SmolLM2 GGUF answer through llama.cpp, streamed token by token."""
from __future__ import annotations

import json
import threading

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from lanner.core.models import JobStatus
from playground_helpers import LONG_QUESTION, answer, receive_until_done

pytestmark = pytest.mark.timeout(300)
QUESTION = "What is 3 plus 3?"


def generate(ws, job_id: int, sides=("tuned",), **options) -> None:
    chats = {side: [{"role": "user", "content": options.pop("question", QUESTION)}] for side in sides}
    ws.send(json.dumps({"type": "generate", "id": "q1", "job_id": job_id, "chats": chats,
                        "temperature": 0, "max_tokens": 24, **options}))


def test_the_fine_tuned_gguf_streams_an_answer_in_its_chat_template(served):
    from transformers import AutoTokenizer

    from lanner.inference.generation import chat_template, render_prompt

    job = served.studio.trained_job
    listed = httpx.get(f"{served.url}/api/playground/jobs/{job}", headers=served.headers).json()
    assert listed["tuned"]["available"] and listed["tuned"]["gguf"].endswith("-q8_0.gguf")
    assert listed["base"]["available"] and listed["base"]["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "path" not in listed["tuned"]

    with connect(served.ws_url) as ws:
        generate(ws, job, system="You answer arithmetic questions.", max_tokens=40)
        messages = receive_until_done(ws, {"tuned"})
    kinds = [m["type"] for m in messages]
    assert kinds[:2] == ["status", "status"] and [m["state"] for m in messages[:2]] == ["loading", "generating"]
    tokens = [m for m in messages if m["type"] == "token"]
    assert len(tokens) >= 3, messages  # incremental: a message per token, not one block at the end
    done = messages[-1]
    assert done["type"] == "done" and done["finish_reason"] in ("stop", "length") and done["chunks"] == len(tokens)
    assert all(m["id"] == "q1" for m in messages)
    text = answer(messages, "tuned")
    assert text.strip() and "<|im_start|>" not in text and "<|im_end|>" not in text

    # The prompt the GGUF answered is the job's chat template as transformers renders it.
    cache = served.app.state.playground_cache
    (path,) = cache.loaded()
    conversation = [{"role": "system", "content": "You answer arithmetic questions."},
                    {"role": "user", "content": QUESTION}]
    with cache.use(path) as entry:
        rendered = render_prompt(entry.model, conversation, chat_template(entry.model, None))
    adapter = served.studio.data_dir / "artifacts" / str(job) / "adapter"
    expected = AutoTokenizer.from_pretrained(adapter).apply_chat_template(conversation, add_generation_prompt=True,
                                                                          tokenize=False)
    assert rendered == expected and rendered.endswith("<|im_start|>assistant\n")


def test_side_by_side_streams_both_models_and_stop_ends_them(served):
    job = served.studio.trained_job
    with connect(served.ws_url) as ws:
        generate(ws, job, sides=("base", "tuned"))
        messages = receive_until_done(ws, {"base", "tuned"})
        for side in ("base", "tuned"):
            assert sum(1 for m in messages if m["type"] == "token" and m["model"] == side) >= 2
            assert answer(messages, side).strip()
            assert any(m["type"] == "done" and m["model"] == side for m in messages)
        assert len(served.app.state.playground_cache.loaded()) == 2

        # A long answer, stopped after its first token.
        generate(ws, job, sides=("base",), question=LONG_QUESTION, max_tokens=2000)
        while json.loads(ws.recv(timeout=60))["type"] != "token":
            pass
        ws.send(json.dumps({"type": "stop"}))
        rest = receive_until_done(ws, {"base"})
    assert rest[-1]["type"] == "done" and rest[-1]["finish_reason"] == "stopped"


def test_two_people_asking_the_same_model_at_once_stream_together_from_one_load(served):
    job = served.studio.trained_job
    received, errors = [], []  # (person, message) in the order the two sockets received them
    lock = threading.Lock()
    ready = threading.Barrier(2)

    def person(name: str):
        try:
            with connect(served.ws_url) as ws:
                ready.wait()
                # Answers of ~2 s each: a short one could end before the other's fresh context read its prompt.
                generate(ws, job, sides=("base",), question=LONG_QUESTION, max_tokens=120)
                while True:
                    message = json.loads(ws.recv(timeout=120))
                    with lock:
                        received.append((name, message))
                    if message["type"] in ("done", "error"):
                        break
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=person, args=(name,)) for name in ("Ann", "Bo")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert not errors
    order = [(name, message["type"]) for name, message in received]
    for name in ("Ann", "Bo"):
        other = "Bo" if name == "Ann" else "Ann"
        assert (name, "done") in order and (name, "token") in order, order
        # each one's first token came before the other's answer ended: the two answers streamed together
        assert order.index((name, "token")) < order.index((other, "done")), order
    states = [message["state"] for _, message in received if message["type"] == "status"]
    assert states.count("generating") == 2 and "waiting" not in states
    cache = served.app.state.playground_cache
    assert cache.loads == 1 and cache.contexts(cache.loaded()[0]) == 2


def test_errors_come_in_words_with_what_to_do(served):
    studio = served.studio
    with connect(served.ws_url) as ws:
        generate(ws, studio.no_eval_job)
        (error,) = receive_until_done(ws, {"tuned"})
        assert error["code"] == "not_exported" and "export a GGUF first" in error["message"]
        assert error["export_url"] == f"/api/jobs/{studio.no_eval_job}/export"

        generate(ws, studio.trained_job, temperature=5)
        (error,) = receive_until_done(ws, {"tuned"})
        assert error["code"] == "bad_request" and error["message"].startswith("temperature:")

        generate(ws, studio.export_job)
        (error,) = receive_until_done(ws, {"tuned"})
        assert error["code"] == "not_a_training_job" and f"job {studio.trained_job}" in error["message"]

        ws.send(json.dumps({"type": "generate", "job_id": studio.trained_job,
                            "chats": {"tuned": [{"role": "assistant", "content": "hi"}]}}))
        (error,) = receive_until_done(ws, {"tuned"})
        assert "must end with the user's message" in error["message"]

    running = studio.add_job(status=JobStatus.running)
    described = httpx.get(f"{served.url}/api/playground/jobs/{running}", headers=served.headers).json()
    assert described["tuned"]["code"] == "not_finished" and described["base"]["available"]
    listed = httpx.get(f"{served.url}/api/playground/jobs", headers=served.headers).json()
    assert [item["job_id"] for item in listed] == [studio.held_out_job, studio.no_eval_job, studio.trained_job]
    assert httpx.get(f"{served.url}/api/playground/jobs").status_code == 401


def test_cpu_chat_says_llama_cpp_is_still_being_built(served, llama_cpp_state):
    llama_cpp_state("building")
    with connect(served.ws_url) as ws:
        generate(ws, served.studio.trained_job)
        (error,) = receive_until_done(ws, {"tuned"})
    assert error["code"] == "llama_cpp_unavailable"
    assert error["message"].startswith("Chat on the CPU needs llama.cpp. llama.cpp is still being built (since ")
    assert error["message"].endswith("ready in a few minutes.")

def test_the_socket_signs_in_like_the_live_streams(served):
    bare = served.ws_url.split("?")[0]
    for url, headers in ((bare, {}), (bare + "?token=lnr_forged", {})):
        with pytest.raises(ConnectionClosed) as closed:
            with connect(url, additional_headers=headers) as ws:
                ws.recv(timeout=10)
        assert closed.value.rcvd.code == 4401
