"""Specs as YAML and command lines, read back within limits, and Axolotl / LLaMA-Factory configs imported."""
from __future__ import annotations

import resource
import textwrap

import pytest

from lanner.core.spec import JobSpec
from lanner.core.spec_files import (MAX_YAML_BYTES, MAX_YAML_DEPTH, SpecFileError, command_line, dump_yaml, load_yaml,
                                    parse, validate)

# Axolotl's examples/llama-3/qlora.yml, as its repository ships it (the model renamed to one Lanner knows).
AXOLOTL_QLORA = """
base_model: NousResearch/Meta-Llama-3-8B
model_type: AutoModelForCausalLM
tokenizer_type: AutoTokenizer

load_in_8bit: false
load_in_4bit: true
strict: false

datasets:
  - path: aaditya/alpaca_subset_1
    type: alpaca
dataset_prepared_path:
val_set_size: 0.05
output_dir: ./outputs/qlora-out

adapter: qlora
lora_model_dir:

sequence_len: 4096
sample_packing: true
pad_to_sequence_len: true

lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_modules:
  - q_proj
  - v_proj
lora_target_linear:
lora_fan_in_fan_out:

wandb_project:
wandb_log_model:

gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 4
optimizer: paged_adamw_32bit
lr_scheduler: cosine
learning_rate: 0.0002

train_on_inputs: false
group_by_length: false
bf16: auto
fp16:
tf32: false

gradient_checkpointing: true
logging_steps: 1
flash_attention: true

warmup_steps: 10
evals_per_epoch: 4
saves_per_epoch: 1
weight_decay: 0.0
special_tokens:
  pad_token: "<|end_of_text|>"
"""

AXOLOTL_DPO = """
base_model: Qwen/Qwen2.5-0.5B-Instruct
rl: dpo
rl_beta: 0.2
adapter: lora
lora_r: 8
lora_alpha: 16
lora_target_linear: true
datasets:
  - path: Intel/orca_dpo_pairs
    type: chatml.intel
sequence_len: 1024
micro_batch_size: 2
gradient_accumulation_steps: 8
max_steps: 300
learning_rate: 5.0e-6
bf16: true
"""

# LLaMA-Factory's examples/train_lora/llama3_lora_sft.yaml.
LLAMA_FACTORY_SFT = """
### model
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
trust_remote_code: true

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all

### dataset
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
max_samples: 1000
overwrite_cache: true
preprocessing_num_workers: 16
dataloader_num_workers: 4

### output
output_dir: saves/llama3-8b/lora/sft
logging_steps: 10
save_steps: 500
plot_loss: true
overwrite_output_dir: true
save_only_model: false
report_to: none

### train
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
ddp_timeout: 180000000
resume_from_checkpoint: null
"""

# LLaMA-Factory's examples/train_lora/llama3_lora_dpo.yaml, with ORPO's loss.
LLAMA_FACTORY_ORPO = """
model_name_or_path: meta-llama/Meta-Llama-3-8B-Instruct
stage: dpo
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: q_proj,v_proj
pref_beta: 0.1
pref_loss: orpo
dataset: dpo_en_demo
template: llama3
cutoff_len: 2048
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 5.0e-6
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
"""


def test_a_spec_dumped_as_yaml_reads_back_as_the_same_spec():
    spec = JobSpec.model_validate({"method": "dpo", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": 3,
                                   "name": "prefs: ünïcode", "hyperparameters": {"learning_rate": 1e-6,
                                                                                "max_steps": 7}}).model_dump(mode="json")
    text = dump_yaml(spec)
    assert text.startswith("# Lanner job spec")
    parsed = parse(text)
    assert parsed.source == "lanner" and not parsed.unmapped
    assert validate(parsed) == (spec, [])


def test_the_command_line_writes_the_file_and_submits_it():
    spec = JobSpec.model_validate({"method": "lora", "model": "Qwen/Qwen2.5-0.5B", "dataset_id": 5}).model_dump(mode="json")
    command = command_line(spec, "http://studio:8000", "job-9.yaml")
    first, *body, end, submit = command.rstrip("\n").split("\n")
    assert first == "cat > job-9.yaml <<'LANNER_SPEC'" and end == "LANNER_SPEC"
    assert submit == 'lanner submit job-9.yaml --url http://studio:8000 --token "$LANNER_TOKEN" --dataset-id 5'
    assert validate(parse("\n".join(body))) == ({k: v for k, v in spec.items() if k != "dataset_id"}, [])


def test_validation_errors_have_the_shape_of_the_apis_422s():
    spec, errors = validate(parse("method: lora\nmodel: builtin/SmolLM2-135M-Instruct\n"
                                  "hyperparameters: {learning_rate: 5, batch_sise: 2}\nlora: {rank: 0}\n"))
    assert spec is None
    assert {(tuple(e["loc"]), e["type"]) for e in errors} == {
        (("body", "hyperparameters", "learning_rate"), "less_than_equal"),
        (("body", "hyperparameters", "batch_sise"), "extra_forbidden"),
        (("body", "lora", "rank"), "greater_than_equal")}
    assert all(e["msg"] for e in errors)


def test_a_dataset_id_given_apart_completes_the_spec():
    spec, errors = validate(parse("method: lora\nmodel: builtin/SmolLM2-135M-Instruct\n"), dataset_id=4)
    assert errors == [] and spec["dataset_id"] == 4


@pytest.mark.parametrize("text, words", [
    ("method: [unclosed", "not valid YAML"),
    ("- a list\n- not a mapping\n", "mapping"),
    ("", "empty"),
    ("!!python/object/apply:os.system ['true']\n", "not valid YAML"),
    ("version: 1\nmethod: lora\n", "version 1"),
    ("a: " + "[" * (MAX_YAML_DEPTH + 5) + "]" * (MAX_YAML_DEPTH + 5) + "\n", "deeper"),
    ("a: &x [*x]\n", "deeper"),
    ("x: " + "y" * MAX_YAML_BYTES + "\n", "KiB"),
    (b"method: \xff\xfe\n", "UTF-8"),
    ("method: \x1f\n", "not valid YAML"),
])
def test_bad_files_are_refused_in_words(text, words):
    with pytest.raises(SpecFileError, match=words):
        parse(text)


def test_a_billion_laughs_file_is_refused_without_expanding_it():
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(SpecFileError, match="aliases"):
        load_yaml("\n".join(lines) + "\n")
    # expanded, it would be 10**10 strings (hundreds of GB); refused, the peak memory stays put
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50 * 1024  # KiB


def test_a_few_aliases_are_fine():
    assert load_yaml("base: &b {rank: 4}\nlora: *b\n") == {"base": {"rank": 4}, "lora": {"rank": 4}}


def test_axolotl_qlora_maps_model_adapter_and_hyperparameters():
    parsed = parse(AXOLOTL_QLORA)
    assert parsed.source == "axolotl"
    assert parsed.spec == {
        "method": "qlora", "model": "NousResearch/Meta-Llama-3-8B",
        "lora": {"rank": 32, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"]},
        "hyperparameters": {"learning_rate": 0.0002, "epochs": 4, "batch_size": 2, "gradient_accumulation": 4,
                            "max_seq_len": 4096, "lr_scheduler": "cosine", "weight_decay": 0.0,
                            "eval_fraction": 0.05, "gradient_checkpointing": True, "packing": True,
                            "completion_only_loss": True, "precision": "auto"}}
    assert {"optimizer", "flash_attention", "warmup_steps", "special_tokens", "output_dir", "tf32",
            "model_type"} <= set(parsed.unmapped)
    assert not {"base_model", "adapter", "lora_r", "datasets", "bf16", "load_in_4bit"} & set(parsed.unmapped)
    assert any("aaditya/alpaca_subset_1" in note and "pick one" in note for note in parsed.notes)
    spec, errors = validate(parsed, dataset_id=1)
    assert errors == [] and spec["method"] == "qlora" and spec["lora"]["rank"] == 32


def test_axolotl_dpo_maps_rl_and_its_beta():
    parsed = parse(AXOLOTL_DPO)
    assert parsed.spec["method"] == "dpo" and parsed.spec["preference"] == {"beta": 0.2}
    assert parsed.spec["lora"] == {"rank": 8, "alpha": 16, "target_modules": "all-linear"}
    assert parsed.spec["hyperparameters"]["max_steps"] == 300 and parsed.spec["hyperparameters"]["precision"] == "bf16"
    spec, errors = validate(parsed)
    assert errors == [] and "dataset_id" not in spec and spec["hyperparameters"]["learning_rate"] == 5e-6


def test_llama_factory_lora_sft():
    parsed = parse(LLAMA_FACTORY_SFT)
    assert parsed.source == "llama-factory"
    assert parsed.spec == {
        "method": "lora", "model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "lora": {"rank": 8, "target_modules": "all-linear"},
        "hyperparameters": {"learning_rate": 1e-4, "epochs": 3.0, "batch_size": 1, "gradient_accumulation": 8,
                            "max_seq_len": 2048, "warmup_ratio": 0.1, "lr_scheduler": "cosine", "save_steps": 500,
                            "precision": "bf16"}}
    assert {"template", "max_samples", "ddp_timeout", "do_train"} <= set(parsed.unmapped)
    assert "dataset" not in parsed.unmapped and "report_to" not in parsed.unmapped  # none: no trackers
    assert any("identity,alpaca_en_demo" in note for note in parsed.notes)
    assert validate(parsed)[1] == []


def test_llama_factory_orpo_from_the_dpo_stage_with_orpo_loss():
    parsed = parse(LLAMA_FACTORY_ORPO)
    assert parsed.spec["method"] == "orpo" and parsed.spec["preference"] == {"beta": 0.1}
    assert parsed.spec["lora"]["target_modules"] == ["q_proj", "v_proj"]
    assert validate(parsed)[1] == []


def test_llama_factory_methods_that_do_not_map_are_said():
    parsed = parse("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: ppo\nfinetuning_type: full\n")
    assert "stage" in parsed.unmapped and any("ppo" in note for note in parsed.notes)
    assert [e["loc"] for e in validate(parsed)[1]] == [["body", "method"]]
    full_pt = parse("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: pt\nfinetuning_type: full\nquantization_bit: 4\n")
    assert full_pt.spec["method"] == "pretrain" and "quantization_bit" in full_pt.unmapped


def test_llama_factory_reward_model_stage_is_a_reward_job():
    parsed = parse("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: rm\nfinetuning_type: lora\nlora_rank: 8\n")
    assert (parsed.spec["method"], parsed.spec["lora"]) == ("reward", {"rank": 8})
    assert validate(parsed)[1] == []


def test_the_source_can_be_forced():
    text = textwrap.dedent("""\
        base_model: Qwen/Qwen2.5-0.5B
        adapter: lora
    """)
    assert parse(text, source="axolotl").spec["method"] == "lora"
    with pytest.raises(SpecFileError, match="Unknown source"):
        parse(text, source="unsloth")


def test_the_trackers_a_config_reports_to_are_chosen_and_what_differs_is_said():
    axolotl = parse(AXOLOTL_DPO + "wandb_project: tuning\nuse_tensorboard: true\nmlflow_tracking_uri: http://x:5000\n")
    assert axolotl.spec["trackers"] == ["wandb", "tensorboard", "mlflow"]
    assert not {"wandb_project", "use_tensorboard", "mlflow_tracking_uri"} & set(axolotl.unmapped)
    assert any("offline run" in note for note in axolotl.notes) and any("admin" in note for note in axolotl.notes)
    assert "trackers" not in parse(AXOLOTL_QLORA).spec  # wandb_project left empty
    factory = parse(LLAMA_FACTORY_SFT.replace("report_to: none", "report_to: [tensorboard, comet_ml]"))
    assert factory.spec["trackers"] == ["tensorboard"] and "report_to" in factory.unmapped
    assert parse(LLAMA_FACTORY_SFT.replace("report_to: none", "report_to: wandb")).spec["trackers"] == ["wandb"]
