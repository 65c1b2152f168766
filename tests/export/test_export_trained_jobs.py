"""Export of what the training process really saved, trained here on the CPU with the real SmolLM2:
a full fine-tune's whole model (no adapter: the 16-bit model is the trained one, its GGUF converted
without a merge) and a QLoRA adapter, merged into the 4-bit base its training recorded, exactly."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from export_helpers import BASE_MODEL_NAME, new_user, run_export_job, signed_in_client
from job_specs import stored_spec

from lanner.core import db
from lanner.core.models import Artifact, Dataset, Job, JobStatus
from lanner.worker.train_process import TRAINING_RECORD

from support import REPO

# A few steps at a short length: enough to move every weight, cheap on two shared cores.
STEPS = {"hyperparameters": {"max_steps": 2, "batch_size": 2, "gradient_accumulation": 1, "max_seq_len": 48,
                             "gradient_checkpointing": False, "precision": "fp32", "before_after_eval": False,
                             "lr_scheduler": "constant", "warmup_ratio": 0.0}}


def train(settings, owner: int, method: str, spec: dict) -> int:
    """A training job of `method` on a few question/answer rows, run by the training process as the
    worker starts it; returns the finished job's id."""
    rows = [{"instruction": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."} for i in range(6)]
    path = settings.data_dir / "datasets" / "qa.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with db.session_factory(settings.database_url)() as session:
        dataset = Dataset(owner_id=owner, name="qa", filename="qa.jsonl", path="datasets/qa.jsonl",
                          size_bytes=path.stat().st_size)
        session.add(dataset)
        session.flush()
        job = Job(owner_id=owner, name=method, method=method, model=BASE_MODEL_NAME, dataset_id=dataset.id,
                  config=stored_spec(method, STEPS, spec, model=BASE_MODEL_NAME, dataset_id=dataset.id), gpus=0)
        session.add(job)
        session.commit()
        job_id = job.id
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    done = subprocess.run([sys.executable, "-m", "lanner.worker.train_process", str(job_id)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with db.session_factory(settings.database_url)() as session:
        session.get(Job, job_id).status = JobStatus.succeeded  # the worker's part
        session.commit()
    return job_id


def artifacts(settings, job_id: int) -> dict[str, Artifact]:
    with db.session_factory(settings.database_url)() as session:
        return {a.kind: a for a in session.query(Artifact).filter_by(job_id=job_id)}


def logits(model_dir, ids_list) -> list:
    import torch
    from transformers import AutoModelForCausalLM

    from lanner.worker.export.verify import _logits

    return _logits(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), ids_list)


def test_a_full_fine_tune_exports_its_own_model_and_a_gguf_that_llama_cpp_runs_like_it(settings, smollm2_dir):
    from transformers import AutoTokenizer

    from lanner.worker.export import verify_gguf
    from lanner.worker.export.verify import F16_KL_BOUND, compare_logits, prompt_ids

    owner = new_user(settings)
    parent = train(settings, owner, "full", {"hyperparameters": {"learning_rate": 1e-4}})
    model_dir = settings.data_dir / artifacts(settings, parent)["model"].path
    record = json.loads((model_dir / TRAINING_RECORD).read_text())
    assert record == {"method": "full", "base_model": BASE_MODEL_NAME, "saved": "model", "dtype": "float32"}

    # The studio's export button: no adapter to offer, so the default export leaves it out.
    client = signed_in_client(settings, owner)
    response = client.post(f"/api/jobs/{parent}/export", json={"merged": True, "gguf_types": ["f16"]})
    assert response.status_code == 201, response.text
    options = response.json()["config"]["export"]
    assert options["adapter"] is False
    status, export = run_export_job(settings, owner, parent, options)
    assert status == JobStatus.succeeded, artifacts(settings, export)

    made = artifacts(settings, export)
    assert set(made) == {"merged", "gguf", "modelfile"}
    merged_dir = settings.data_dir / made["merged"].path
    assert made["merged"].verification["passed"] and made["merged"].verification["tensors_differing"] == []
    assert (merged_dir / "model.safetensors").is_file() and (merged_dir / "chat_template.jinja").is_file()
    assert not (merged_dir / "adapter_config.json").exists()
    assert json.loads((merged_dir / "config.json").read_text())["dtype"] == "bfloat16"
    assert made["gguf"].verification["passed"]

    # llama.cpp runs the GGUF like the trained model itself (float32, as it was saved), and not like
    # the base model it was trained from.
    ids = prompt_ids(AutoTokenizer.from_pretrained(model_dir))
    trained = {"ids": ids, "logits": logits(model_dir, ids)}
    gguf = settings.data_dir / made["gguf"].path
    check = verify_gguf(gguf, trained, kl_bound=F16_KL_BOUND, require_top1=True)
    print(f"\nf16 GGUF vs the trained model: {check}")
    assert check["passed"], check
    to_base = compare_logits(logits(smollm2_dir, ids), trained["logits"])
    assert to_base["max_abs_logit_diff"] > 5 * check["max_abs_logit_diff"], to_base


def test_a_whole_model_job_has_no_adapter_to_export(settings, smollm2_dir, tmp_path):
    from lanner.worker.export import ExportError, ExportRequest, run_export

    owner = new_user(settings)
    with db.session_factory(settings.database_url)() as session:
        job = Job(owner_id=owner, name="full", method="full", model=BASE_MODEL_NAME, status=JobStatus.succeeded,
                  config={})
        session.add(job)
        session.flush()
        session.add(Artifact(job_id=job.id, kind="model", name="model", path=f"artifacts/{job.id}/model"))
        session.commit()
        parent = job.id
    client = signed_in_client(settings, owner)
    asked = client.post(f"/api/jobs/{parent}/export", json={"adapter": True, "gguf_types": ["f16"]})
    assert asked.status_code == 422
    assert "trained every weight (full), so it has no LoRA adapter" in asked.text, asked.text

    # The export itself refuses it too (a job queued with the adapter asked for), before writing anything.
    with pytest.raises(ExportError, match="The job trained every weight, so it has no LoRA adapter to export"):
        run_export(ExportRequest(base_model_dir=smollm2_dir, adapter_dir=None, model_dir=smollm2_dir,
                                 out_dir=tmp_path / "export", adapter=True))
    assert not (tmp_path / "export").exists()


def test_a_qlora_job_records_its_4bit_base_and_its_adapter_merges_into_it_exactly(settings, smollm2_dir):
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file

    from lanner.kernels.quant import dequantize_model, load_4bit

    owner = new_user(settings)
    parent = train(settings, owner, "qlora", {"hyperparameters": {"learning_rate": 1e-3},
                                              "lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}})
    adapter_dir = settings.data_dir / artifacts(settings, parent)["adapter"].path
    record = json.loads((adapter_dir / TRAINING_RECORD).read_text())
    # What the layers held: NF4 in blocks of 64, double-quantised, from the training dtype (float32 on
    # the CPU; the checkpoint is bfloat16); no experts (a dense model).
    quantization = {"quant_type": "nf4", "blocksize": 64, "double_quant": True, "dtype": "float32", "experts": False}
    assert record == {"method": "qlora", "base_model": BASE_MODEL_NAME, "saved": "adapter", "dtype": "float32",
                      "quantization": quantization}

    status, export = run_export_job(settings, owner, parent, {"adapter": True, "merged": True, "gguf_types": []})
    assert status == JobStatus.succeeded, artifacts(settings, export)
    made = artifacts(settings, export)
    assert set(made) == {"adapter", "merged"}
    check = made["merged"].verification
    assert check["passed"] and "4-bit base" in check["check"], check
    manifest = json.loads((settings.data_dir / made["merged"].path).parent.joinpath("export.json").read_text())
    assert manifest["artifacts"][1]["merged_into"] == {"dequantised_base": quantization}

    # The same merge made independently on lanner.kernels' own QLoRA model: the base quantised on load
    # as training loads it, the trained adapter on top, dequantised (kernels' dequantize_model) and
    # merged by PEFT, rounded to bfloat16 once. Bit for bit the exported merged model.
    base = load_4bit(smollm2_dir, device="cpu", dtype=torch.float32)
    model = dequantize_model(PeftModel.from_pretrained(base, adapter_dir), torch.float32)
    expected = {name: tensor.to(torch.bfloat16) for name, tensor in model.merge_and_unload().state_dict().items()}
    exported = load_file(settings.data_dir / made["merged"].path / "model.safetensors")
    assert exported and set(exported) <= set(expected)
    differ = [name for name, tensor in exported.items() if not torch.equal(tensor, expected[name])]
    assert differ == []
    # ... and that is not the 16-bit checkpoint: a layer the adapter does not touch is the NF4 round trip.
    original = load_file(smollm2_dir / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(exported[name], original[name])
