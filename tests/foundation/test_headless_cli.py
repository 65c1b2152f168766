"""The headless CLI: `lanner train` runs the worker's training process here (no API, no Redis), and
`lanner submit` queues a spec file on a running studio and follows the job to its end."""
from __future__ import annotations

import argparse
import json
import subprocess

import httpx

from support import LANNER_BIN, TEST_CACHE, process_env

SPEC = """\
method: lora
model: builtin/SmolLM2-135M-Instruct
gpus: 0
hyperparameters: {max_steps: 2, batch_size: 2, gradient_accumulation: 1, max_seq_len: 64, save_steps: 2,
                  precision: fp32, gradient_checkpointing: false, before_after_eval: false}
lora: {rank: 2, alpha: 4, target_modules: [q_proj, v_proj]}
"""
ROWS = [{"instruction": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."} for i in range(8)]
# the same sign-in as the browser tests', which may have set the shared studio up first
ADMIN = {"email": "ada@lanner.test", "display_name": "Ada Admin", "password": "correct horse 42"}


def files(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return tmp_path / "spec.yaml", tmp_path / "rows.jsonl"


def lanner(*args, env=None, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([LANNER_BIN, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def test_lanner_train_writes_the_adapter_and_prints_the_events(tmp_path):
    spec, rows = files(tmp_path)
    env = process_env()
    env.update(LANNER_DATA_DIR=str(TEST_CACHE), LANNER_REDIS_URL="redis://127.0.0.1:1/0")  # no Redis to reach
    # a studio's S3 store in the environment (nothing listens there): `lanner train` keeps to its run folder
    env.update(LANNER_STORE="s3", LANNER_S3_BUCKET="team", LANNER_S3_ENDPOINT_URL="http://127.0.0.1:9",
               LANNER_STORE_RETRY_S="0")
    run = lanner("train", spec, "--dataset", rows, "--out", tmp_path / "out", env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    adapter = tmp_path / "out" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert json.loads((adapter / "lanner_training.json").read_text())["method"] == "lora"
    assert (tmp_path / "out" / "checkpoints" / "checkpoint-2").is_dir()
    assert "Training for 2 steps" in run.stderr and "checkpoint checkpoint-2 at step 2" in run.stderr
    assert "Adapter saved" in run.stderr and "2/2" in run.stderr  # the progress bar's end
    assert "Done: " in run.stdout
    assert "lanner.kernels: not used" in run.stderr  # the CPU path a user's machine takes: plain PEFT

    again = lanner("train", spec, "--dataset", rows, "--out", tmp_path / "out", env=env)
    assert again.returncode != 0 and "is not empty" in again.stderr
    (tmp_path / "bad.yaml").write_text("method: lora\nmodel: builtin/SmolLM2-135M-Instruct\nlora: {rank: 0}\n")
    bad = lanner("train", tmp_path / "bad.yaml", "--dataset", rows, "--out", tmp_path / "other", env=env)
    assert bad.returncode != 0 and "lora.rank: Input should be greater than or equal to 1" in bad.stderr
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n")
    wrong = lanner("train", spec, "--dataset", tmp_path / "pairs.jsonl", "--out", tmp_path / "pairs", env=env)
    assert wrong.returncode == 1 and "this method needs sft rows" in wrong.stderr  # the worker's reason, as it says it


def test_lanner_submit_uploads_queues_and_follows_the_job(stack, tmp_path):
    spec, rows = files(tmp_path)
    client = httpx.Client(base_url=stack.url)
    if client.get("/api/setup").json()["needed"]:
        assert client.post("/api/setup", json=ADMIN).is_success
    else:
        assert client.post("/api/auth/sign-in", json={"email": ADMIN["email"], "password": ADMIN["password"]}).is_success
    token = client.post("/api/tokens", json={"name": "cli"}).json()["token"]

    refused = lanner("submit", spec, "--url", stack.url, "--token", "not-a-token", "--dataset-id", "1", env=stack.env)
    assert refused.returncode != 0 and "(401)" in refused.stderr

    run = lanner("submit", spec, "--url", stack.url, "--token", token, "--dataset", rows, env=stack.env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Uploaded rows.jsonl as dataset" in run.stdout and "succeeded" in run.stdout
    assert "Training for 2 steps" in run.stderr and "status: succeeded" in run.stderr
    job_id = int(run.stdout.split("Job ", 1)[1].split()[0])
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["config"]["lora"]["rank"] == 2

    # An export follows its job as submit does; here only what is its own: the flags, and a refusal in words.
    missing = lanner("export", 999_999, "--url", stack.url, "--token", token, env=stack.env)
    assert missing.returncode == 1 and "(404)" in missing.stderr and "No job 999999" in missing.stderr


def test_export_flags_send_only_what_they_change():
    from lanner.cli.remote import export_options

    def flags(types=None, **off):  # as argparse gives them: --gguf T (repeated), --no-X
        return argparse.Namespace(gguf=types, **{f"no_{name}": off.get(name, False)
                                                 for name in ("adapter", "merged", "verify", "gguf")})

    assert export_options(flags()) == {}
    assert export_options(flags(["q4_k_m", "f16"], merged=True)) == {"merged": False, "gguf_types": ["q4_k_m", "f16"]}
    assert export_options(flags(gguf=True, adapter=True, verify=True)) == {"adapter": False, "verify": False,
                                                                           "gguf_types": []}
