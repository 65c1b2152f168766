"""Fidelity of LoRA over an FP8 base (issue 23, docs/fp8.md): the same LoRA run over the bf16 base and over
the FP8 base, on a real small model and real text, loss at every step and a held-out eval loss.

    python benchmarks/fp8_fidelity.py --out fp8_fidelity.json                 # GPU: 300 steps, SmolLM2
    python benchmarks/fp8_fidelity.py --device cpu --steps 3 --seq 64 --bs 2  # a smoke test here

The model: SmolLM2-135M-Instruct's real weights (--model PATH; default the studio's imported built-in
model, lanner.core.default_model). The text, offline and the same on every machine: the docstrings of the
running Python's standard library (every module, class and function docstring of its .py files, read
with ast, in sorted path order) and this repository's docs/*.md. Every tenth document is held out for
the eval loss; the rest is tokenised, joined with EOS and cut into rows of --seq tokens, taken in one
fixed shuffled order by both runs, so the two see the same batches.

Both runs: bf16 model, LoRA r16 on the seven projections, AdamW, linear warm-up then constant LR, the
same seed for the LoRA init. The bar (issue 23): after --warmup-steps, every step's loss within 1% of
the bf16 run's, and the held-out eval loss within 1%. Writes one JSON document: both loss curves, the
per-step relative differences (raw and over a 10-step moving mean), eval losses, times and the verdicts.
"""
from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
BAR = 0.01


def documents() -> list[str]:
    """The corpus: the standard library's docstrings, then this repository's docs, in a fixed order."""
    texts = []
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(stdlib.rglob("*.py")):
        if any(part in ("test", "tests", "idlelib", "site-packages", "lib2to3") for part in path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    texts.append(doc)
    texts += [path.read_text() for path in sorted((REPO / "docs").glob("*.md"))]
    return texts


def rows(tokenizer, texts: list[str], seq: int) -> list[list[int]]:
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return [ids[i:i + seq] for i in range(0, len(ids) - seq + 1, seq)]


def default_model() -> str:
    from lanner.core.default_model import imported_model_dir
    from lanner.core.settings import get_settings

    return str(imported_model_dir(get_settings().models_dir))


def run(base: str, args, train_rows, eval_rows) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from lanner.kernels import get_lora_model

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(args.device)
    model = get_lora_model(model, r=args.rank, lora_alpha=args.rank, target_modules=TARGETS,
                           load_in_fp8=base == "fp8", gradient_checkpointing=True)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / args.warmup_steps))
    losses, started = [], time.perf_counter()
    model.train()
    for step in range(args.steps):
        batch = torch.tensor([train_rows[(step * args.bs + i) % len(train_rows)] for i in range(args.bs)],
                             device=args.device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step(), schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 25 == 0 or step == args.steps - 1:
            print(f"[{base}] step {step}: loss {losses[-1]:.4f} ({time.perf_counter() - started:.0f} s)",
                  file=sys.stderr, flush=True)
    train_s = time.perf_counter() - started
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for i in range(0, len(eval_rows), args.bs):
            batch = torch.tensor(eval_rows[i:i + args.bs], device=args.device)
            total += model(input_ids=batch, labels=batch).loss.item() * batch.numel()
            count += batch.numel()
    return dict(losses=losses, eval_loss=total / count, train_s=round(train_s, 1))


def moving_mean(values: list[float], window: int = 10) -> list[float]:
    return [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def compare(bf16: dict, fp8: dict, warmup_steps: int) -> dict:
    raw = [abs(a - b) / b for a, b in zip(fp8["losses"], bf16["losses"])]
    smooth = [abs(a - b) / b for a, b in zip(moving_mean(fp8["losses"]), moving_mean(bf16["losses"]))]
    after = slice(warmup_steps, None)
    eval_diff = abs(fp8["eval_loss"] - bf16["eval_loss"]) / bf16["eval_loss"]
    return dict(max_step_rel_diff=max(raw[after], default=0.0), max_smoothed_rel_diff=max(smooth[after], default=0.0),
                steps_over_bar=[i for i, d in enumerate(raw) if i >= warmup_steps and d > BAR],
                eval_rel_diff=eval_diff, step_rel_diffs=[round(d, 5) for d in raw],
                passes=max(raw[after], default=0.0) <= BAR and eval_diff <= BAR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a Hugging Face checkpoint (default: the built-in SmolLM2)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup-steps", type=int, default=20, help="LR warm-up; the bar applies after it")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--bs", type=int, default=8)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--eval-rows", type=int, default=64)
    parser.add_argument("--out", default=None, help="write the JSON here too")
    args = parser.parse_args()
    args.model = args.model or default_model()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    texts = documents()
    held_out = [t for i, t in enumerate(texts) if i % 10 == 9]
    train_rows = rows(tokenizer, [t for i, t in enumerate(texts) if i % 10 != 9], args.seq)
    random.Random(0).shuffle(train_rows)
    eval_rows = rows(tokenizer, held_out, args.seq)[:args.eval_rows]
    print(f"corpus: {len(texts)} documents, {len(train_rows)} training rows and {len(eval_rows)} held-out rows "
          f"of {args.seq} tokens", file=sys.stderr, flush=True)
    results = {base: run(base, args, train_rows, eval_rows) for base in ("bf16", "fp8")}
    report = dict(model=args.model, device=args.device, steps=args.steps, seq=args.seq, bs=args.bs, rank=args.rank,
                  lr=args.lr, warmup_steps=args.warmup_steps, train_rows=len(train_rows), eval_rows=len(eval_rows),
                  bar=BAR, **compare(results["bf16"], results["fp8"], args.warmup_steps), runs=results)
    if args.device.startswith("cuda"):
        import torch
        report["gpu"] = torch.cuda.get_device_name()
    text = json.dumps(report)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
