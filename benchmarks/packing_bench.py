"""Padding removed by padding-free packing on a real mixed-length chat dataset (CPU, no GPU needed).

    pip download chitchat-dataset==0.9.0 --no-deps -d /tmp/cc && unzip -o /tmp/cc/*.whl -d /tmp/cc/x
    python benchmarks/packing_bench.py /tmp/cc/x/chitchat_dataset/dataset.json TOKENIZER_DIR

Each conversation (the BYU "Chit Chat Challenge" set: 7,168 real two-person chats) becomes one
chat-template sample, turns alternating user/assistant, truncated to --max-length tokens. Prints the
tokens a padded loader feeds (shuffled, batches padded to their longest sample) against packed rows
of --max-length, for a few batch sizes.
"""
from __future__ import annotations

import argparse
import json
import random

from transformers import AutoTokenizer

from lanner.kernels.packing import pack_samples, padded_tokens


def conversations(path: str) -> list[list[dict]]:
    chats = []
    for conversation in json.load(open(path)).values():
        turns = [" ".join(m["text"] for m in block) for block in conversation["messages"]]
        chats.append([{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)])
    return chats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("tokenizer")
    parser.add_argument("--max-length", type=int, default=2048)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    texts = [tokenizer.apply_chat_template(chat, tokenize=False) for chat in conversations(args.dataset)]
    samples = [ids[: args.max_length] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    random.Random(0).shuffle(samples)
    lengths = [len(s) for s in samples]
    real = sum(lengths)
    packed = pack_samples(samples, args.max_length)
    print(f"{len(samples)} samples, {real:,} tokens; length min {min(lengths)}, median "
          f"{sorted(lengths)[len(lengths) // 2]}, max {max(lengths)} (truncated at {args.max_length})")
    print("| loader | rows | tokens fed | padding | padding removed by packing |")
    print("|---|---|---|---|---|")
    for batch in (4, 8, 16):
        fed = padded_tokens(lengths, batch)
        print(f"| padded, batch {batch} | {len(samples)} | {fed:,} | {1 - real / fed:.1%} | "
              f"{1 - packed.input_ids.numel() / fed:.1%} |")
    print(f"| packed into {args.max_length} | {packed.input_ids.shape[0]} | {packed.input_ids.numel():,} "
          f"| {packed.padding_fraction:.2%} | |")


if __name__ == "__main__":
    main()
