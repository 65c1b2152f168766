"""GRPO's training phase on our kernels against plain TRL + PEFT (issue 26): one process per system.

    python3 benchmarks/grpo_bench.py all --model llama-8b --steps 3 --warmup 1 --out $OUT/grpo.jsonl
    python3 benchmarks/grpo_bench.py kernels --model llama-tiny --steps 2 --warmup 1   # one system; CPU too

Both systems run TRL's GRPOTrainer with the studio's GRPOConfig (worker/training/grpo.py's grpo_config of
one grpo job spec: LoRA r16 alpha 32 on the 7 projections, bf16 on a GPU, seed 42, KL beta 0.04) on the same
random weights of a peer_bench CONFIGS shape, prompts of --prompt-len tokens, --group completions of exactly
--completion-len tokens each (min_new_tokens: random weights would otherwise stop at different lengths),
and a length reward (a python reward function of the job spec, run in-process: no sandbox).
- kernels: the model as a grpo job builds it (worker/training/model.py's load_model: get_lora_model with
  non-reentrant checkpointing, patch_model, and the memory engine with a budget picked from the device's free
  memory, as for lora jobs), trained by the studio's LannerGRPOTrainer.
- plain: transformers (sdpa attention) + PEFT LoRA through GRPOTrainer's peft_config, checkpointing as TRL
  users get it: GRPOConfig(gradient_checkpointing=True) (TRL's default; the Trainer switches it on with
  TRL's/transformers' default kwargs and TRL calls enable_input_require_grads). The one field that differs:
  the studio's config says False because its model arrives with checkpointing on.
Each optimizer step is cut, the device synchronised at each cut, into generation (_generate), reward
scoring (_calculate_rewards), the reference and old log-probs (the rest of _generate_and_score_completions)
and the training phase (the rest: the loss's forward and backward over every micro-batch, the optimizer
step). Training tokens/s = prompt + completion tokens of the loss's micro-batches (their masks) / training
seconds, the median over the steps after --warmup. Prints one JSON line; `all` runs kernels then plain as
subprocesses and prints a table. On a machine without CUDA it runs in float32, the kernels under Triton's
interpreter. --kernel-profile-dir DIR: torch.profiler over the training phase of one more step after the timed
ones (not in the timings), written as
peer_bench.py's --kernel-profile writes it (GPU time by kernel, then by operator) to DIR/grpo-SYSTEM-MODEL.txt,
with the phase's wall time under the profiler last (GPU busy far below it: the host is what the GPU waits on).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from peer_bench import CONFIGS, STARTED, TARGETS, fresh_model, progress, write_kernel_profile

SYSTEMS = {"kernels": "Lanner kernels (studio GRPO job)", "plain": "TRL + PEFT"}
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
# The reward: the completion's length in characters, which differs within a group whatever the tokenizer
# (every advantage nonzero), though each completion has the same number of tokens.
LENGTH_REWARD = """
def reward(prompts, completions, **columns):
    return [len(completion) / 1000 for completion in completions]
"""


def word_tokenizer(vocab_size: int):
    """peer_bench.saved_dir's WordLevel tokenizer with a word for every id of the model's vocabulary
    ("w4", "w5", ...) split on whitespace, so that a prompt of n words is n tokens and every sampled id
    decodes to text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS)} | {f"w{i}": i for i in range(len(SPECIALS), vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")


def prompt_rows(tokenizer, count: int, length: int, vocab_size: int, shortest: int | None = None) -> list[dict]:
    """Text prompts of exactly `length` tokens (with `shortest`, each of a length drawn from shortest..length, so
    that batches are left-padded as real prompts are), all ids in the model's vocabulary: random ids decoded, cut
    to the length and decoded again; a draw whose text does not encode back to that is drawn again (seeded)."""
    import random

    rng, special, rows = random.Random(0), set(tokenizer.all_special_ids), []

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    for _ in range(100 * count):
        wanted = length if shortest is None else rng.randint(shortest, length)
        ids = [i for i in (rng.randrange(min(len(tokenizer), vocab_size)) for _ in range(2 * wanted))
               if i not in special]
        text = tokenizer.decode(encode(tokenizer.decode(ids))[:wanted])
        ids = encode(text)
        if len(ids) == wanted and max(ids) < vocab_size:
            rows.append({"prompt": text})
            if len(rows) == count:
                return rows
    raise SystemExit(f"could not draw prompts of exactly {length} tokens with this tokenizer")


def job_options(a):
    """The training options of a grpo job spec with the bench's sizes, as the training process builds them."""
    from lanner.core.spec import JobSpec
    from lanner.worker.training.options import training_options

    completions = a.prompts * a.group
    if completions % a.micro_batch:
        raise SystemExit(f"--micro-batch {a.micro_batch} must divide --prompts x --group ({completions})")
    spec = JobSpec(method="grpo", model=f"random/{a.model}", dataset_id=1,
                   hyperparameters=dict(max_steps=total_steps(a), batch_size=a.micro_batch,
                                        gradient_accumulation=completions // a.micro_batch,
                                        max_seq_len=a.prompt_len + a.completion_len, save_steps=10_000_000),
                   lora=dict(rank=a.rank),
                   grpo=dict(num_generations=a.group, max_completion_len=a.completion_len, beta=a.beta,
                             samples_logged=0, reward_functions=[dict(kind="python", name="length",
                                                                      source=LENGTH_REWARD)]))
    return training_options(spec)


def in_process(source: str):
    """A python reward function's source run in this process (it is ours: no sandbox), given texts as the
    studio's functions are."""
    from lanner.worker.training.grpo import text_of

    namespace = {}
    exec(source, namespace)

    def length(prompts, completions, **columns):
        return namespace["reward"](prompts, [text_of(completion) for completion in completions], **columns)

    return length


def synchronize():
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def total_steps(a) -> int:
    """The warm-up, the timed steps, and one more, untimed, under the profiler when --kernel-profile-dir is given
    (profiling slows a step several times over)."""
    return a.warmup + a.steps + (1 if a.kernel_profile_dir else 0)


def recorder_class():
    from transformers import TrainerCallback

    class Recorder(TrainerCallback):
        """Each optimizer step's seconds by phase and its training tokens; the logged losses and lengths."""

        def __init__(self, profile_path: str | None = None, profiled_step: int = -1):
            self.steps, self.current, self.logs, self.checkpointing = [], None, [], None
            self.profile_path, self.profiled_step, self.profiler = profile_path, profiled_step, None

        def on_step_begin(self, args, state, control, model=None, **kwargs):
            if self.checkpointing is None:  # as the training steps find it (the Trainer switches it on in train)
                self.checkpointing = bool(model.is_gradient_checkpointing)
            synchronize()
            self.current = dict(generation_s=0.0, reward_s=0.0, scoring_s=0.0, tokens=0, started=time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            synchronize()
            if self.profiler is not None:
                self.profiler.__exit__(None, None, None)
                write_kernel_profile(self.profiler, self.profile_path, steps=1)
                wall_ms = 1000 * (time.perf_counter() - self.profiled_from)
                with open(self.profile_path, "a") as handle:
                    handle.write(f"\ntraining phase under the profiler: {wall_ms:.1f} ms wall\n")
                self.profiler = None
            step = self.current
            step["step_s"] = time.perf_counter() - step.pop("started")
            step["training_s"] = step["step_s"] - step["scoring_s"]
            step["reference_s"] = step.pop("scoring_s") - step["generation_s"] - step["reward_s"]
            self.steps.append(step)
            progress(f"step {len(self.steps)}: " + ", ".join(f"{key} {value:.2f}" for key, value in step.items()))

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                self.logs.append(logs)

        def profile_training_phase(self):
            """In the profiled step (the one after the timed ones): from the end of its scoring (generation,
            rewards, reference) to its end."""
            import torch

            if self.profile_path and len(self.steps) == self.profiled_step and self.profiler is None:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)
                self.profiler.__enter__()
                self.profiled_from = time.perf_counter()

        def timed(self, key: str, call, *args):
            synchronize()
            start = time.perf_counter()
            try:
                return call(*args)
            finally:
                synchronize()
                self.current[key] += time.perf_counter() - start

    return Recorder


def timed_trainer(trainer_class):
    """trainer_class with its step's phases timed into a Recorder."""

    class Timed(trainer_class):
        def __init__(self, *args, recorder, **kwargs):
            self.recorder = recorder
            super().__init__(*args, callbacks=[recorder], **kwargs)

        def _generate_and_score_completions(self, inputs):
            scored = self.recorder.timed("scoring_s", super()._generate_and_score_completions, inputs)
            self.recorder.profile_training_phase()
            return scored

        def _generate(self, prompts):
            return self.recorder.timed("generation_s", super()._generate, prompts)

        def _calculate_rewards(self, *args):
            return self.recorder.timed("reward_s", super()._calculate_rewards, *args)

        def compute_loss(self, model, inputs, *args, **kwargs):
            self.recorder.current["tokens"] += int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
            return super().compute_loss(model, inputs, *args, **kwargs)

    return Timed


class StderrEvents:
    """What load_model logs to a job's events, on stderr."""

    def __init__(self):
        self.lines = []

    def log(self, message: str, level: str = "info") -> None:
        self.lines.append(message)
        progress(f"{level}: {message}")


def run_system(a) -> dict:
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before transformers' model modules import triton
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOTrainer

    from lanner.kernels import DEFAULT_TARGET_MODULES
    from lanner.worker.training.grpo import LannerGRPOTrainer, grpo_config
    from lanner.worker.training.model import device, load_model, load_tokenizer, training_dtype

    assert list(DEFAULT_TARGET_MODULES) == TARGETS
    options = job_options(a)
    vocab_size = CONFIGS[a.model]["vocab_size"]
    tokenizer = load_tokenizer(a.tokenizer, options) if a.tokenizer else word_tokenizer(vocab_size)
    rows = prompt_rows(tokenizer, a.prompts * total_steps(a), a.prompt_len, vocab_size, a.prompt_len_min)
    progress(f"{a.system} {a.model}: imports done")
    torch.manual_seed(0)
    base = fresh_model(a.model, device(), training_dtype(options))
    progress("random weights made")
    profile_path = None
    if a.kernel_profile_dir:
        os.makedirs(a.kernel_profile_dir, exist_ok=True)
        profile_path = os.path.join(a.kernel_profile_dir, f"grpo-{a.system}-{a.model}.txt")
    recorder = recorder_class()(profile_path, a.warmup + a.steps)  # the extra step after the timed ones
    output_dir = f"/tmp/grpo-bench-{a.system}-{os.getpid()}"
    generation = {"min_new_tokens": a.completion_len}  # random weights would sample the end of text anywhere
    common = dict(reward_funcs=[in_process(LENGTH_REWARD)], train_dataset=Dataset.from_list(rows),
                  processing_class=tokenizer, recorder=recorder)
    events = StderrEvents()
    if a.system == "kernels":
        model = load_model(f"random/{a.model}", options, events, base=base)
        args = grpo_config(options, output_dir, False, generation_kwargs=generation)
        trainer = timed_trainer(LannerGRPOTrainer)(model=model, args=args, on_samples=None, samples_logged=0,
                                                   **common)
        checkpointing = "the memory engine's plan (the studio's: a budget from the device's free memory)"
    else:
        lora = LoraConfig(r=options.lora_r, lora_alpha=options.lora_alpha, lora_dropout=options.lora_dropout,
                          target_modules=TARGETS, task_type="CAUSAL_LM")
        args = grpo_config(options, output_dir, False, generation_kwargs=generation, gradient_checkpointing=True)
        trainer = timed_trainer(GRPOTrainer)(model=base, peft_config=lora, args=args, **common)
        checkpointing = f"GRPOConfig(gradient_checkpointing=True), kwargs {trainer.args.gradient_checkpointing_kwargs}"
    del base
    progress("trainer ready")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    trainer.train()
    shutil.rmtree(output_dir, ignore_errors=True)  # nothing saved there (save_steps is beyond the run)
    timed_steps = recorder.steps[a.warmup:a.warmup + a.steps]
    from lanner.kernels.memory import memory_engine_of

    engine = memory_engine_of(trainer.model)
    plan = " ".join(layer.code for layer in engine.plan.layers) if engine is not None and engine.plan else None
    if not timed_steps:
        raise SystemExit("no steps after the warm-up: raise --steps")

    def median(key):
        return round(statistics.median(step[key] for step in timed_steps), 3)

    return dict(system=a.system, model=a.model, tok_s=round(statistics.median(s["tokens"] / s["training_s"]
                                                                           for s in timed_steps)),
                training_s=median("training_s"), generation_s=median("generation_s"), reward_s=median("reward_s"),
                reference_s=median("reference_s"), step_s=median("step_s"), tokens=timed_steps[0]["tokens"],
                prompt_len=a.prompt_len, prompt_len_min=a.prompt_len_min, completion_len=a.completion_len,
                group=a.group, prompts=a.prompts,
                micro_batch=a.micro_batch, beta=a.beta, rank=a.rank, steps=a.steps, warmup=a.warmup,
                completion_lengths=[log.get("completions/mean_length") for log in recorder.logs],
                losses=[float(f"{log['loss']:.4g}") for log in recorder.logs],
                rewards=[round(log["reward"], 4) for log in recorder.logs if "reward" in log],
                held_gib=round(held / 2**30, 2),
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
                checkpointing=checkpointing, checkpointing_on=recorder.checkpointing, memory_plan=plan,
                kernels=next((line for line in events.lines if line.startswith("lanner.kernels")), None),
                dtype=str(training_dtype(options)).removeprefix("torch."),
                tokenizer=a.tokenizer or "word-level (peer_bench)",
                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                versions=versions("torch", "transformers", "trl", "peft", "datasets", "accelerate", "triton"),
                all_steps=[{key: round(value, 3) for key, value in step.items()} for step in recorder.steps],
                kernel_profile=profile_path, process_s=round(time.perf_counter() - STARTED, 1))


def versions(*names: str) -> dict:
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def run_all(a) -> int:
    """Each system in a fresh process (no patches or allocator state shared), then a table."""
    results = []
    for system in SYSTEMS:
        command = [sys.executable, str(Path(__file__).resolve()), system, *child_args(a)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "BENCH_STACKS_AFTER": str(max(1, a.timeout - 10))}
        progress(f"running {system}: {' '.join(command[2:])}")
        try:
            done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, timeout=a.timeout)
            lines = [line for line in done.stdout.splitlines() if line.startswith('{"')]
            result = json.loads(lines[-1]) if lines else dict(error=f"exit {done.returncode}, no result line")
        except subprocess.TimeoutExpired:
            result = dict(error=f"timed out after {a.timeout} s")
        result = {"system": system, "model": a.model, **result}
        print(json.dumps(result), flush=True)
        results.append(result)
        write(a.out, result)
    print(table(results), flush=True)
    return 0 if all("error" not in r for r in results) else 1


def child_args(a) -> list[str]:
    args = ["--model", a.model, "--steps", str(a.steps), "--warmup", str(a.warmup), "--prompt-len", str(a.prompt_len),
            "--completion-len", str(a.completion_len), "--group", str(a.group), "--prompts", str(a.prompts),
            "--micro-batch", str(a.micro_batch), "--beta", str(a.beta), "--rank", str(a.rank)]
    args += ["--tokenizer", a.tokenizer] if a.tokenizer else []
    args += ["--prompt-len-min", str(a.prompt_len_min)] if a.prompt_len_min else []
    return args + (["--kernel-profile-dir", a.kernel_profile_dir] if a.kernel_profile_dir else [])


def table(results: list[dict]) -> str:
    rows = ["| system | training tok/s | vs plain | training s/step | generation s/step | reward s | reference s "
            "| tokens/step | peak GiB | mean rewards | losses |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    plain = next((r for r in results if r["system"] == "plain" and "error" not in r), None)
    for r in results:
        if "error" in r:
            rows.append(f"| {SYSTEMS[r['system']]} | failed: {r['error']} | | | | | | | | | |")
            continue
        ratio = f"{r['tok_s'] / plain['tok_s']:.2f}x" if plain else "-"
        rows.append(f"| {SYSTEMS[r['system']]} | {r['tok_s']:,} | {ratio} | {r['training_s']} | {r['generation_s']} "
                    f"| {r['reward_s']} | {r['reference_s']} | {r['tokens']:,} | {r['peak_gib']} | {r['rewards']} "
                    f"| {r['losses']} |")
    return "\n".join(rows)


def write(path: str | None, result: dict) -> None:
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(result) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("system", choices=[*SYSTEMS, "all"])
    parser.add_argument("--model", default="llama-8b", choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=1, help="steps before them, not timed (compiles, autotunes)")
    parser.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt")
    parser.add_argument("--prompt-len-min", type=int, default=None,
                        help="prompts of lengths drawn from this to --prompt-len (left-padded batches, as in a real "
                             "job); default: all of --prompt-len")
    parser.add_argument("--completion-len", type=int, default=128, help="tokens per completion, exactly")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per optimizer step")
    parser.add_argument("--micro-batch", type=int, default=8, help="completions per forward/backward")
    parser.add_argument("--beta", type=float, default=0.04, help="KL coefficient (0: no reference log-probs)")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder (e.g. $LANNER_TEST_TOKENIZER_DIR) "
                                                          "instead of the word-level one")
    parser.add_argument("--kernel-profile-dir", default=None,
                        help="write each system's GPU time by kernel over the training phase of one more, untimed step here")
    parser.add_argument("--timeout", type=int, default=240, help="all: seconds per system")
    parser.add_argument("--out", default=None, help="append each result as a JSON line here")
    a = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.system == "all":
        return run_all(a)
    result = run_system(a)
    print(json.dumps(result), flush=True)
    write(a.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
