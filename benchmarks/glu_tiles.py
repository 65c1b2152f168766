"""The GLU kernel with rank-r terms (FP8 bases: gate's and up's terms in forward, the down projection's in
backward) over tile shapes, on the 8B MLP (8,192 tokens x 14,336, rank 16, bf16), beside the plain GLU.

    python benchmarks/glu_tiles.py            # on the GPU; prints a markdown table, best tiles last

Bytes counted: each input read once and each output written once (forward: gate, up, out; backward:
dout, gate, up read and out, d_gate, d_up written); the terms' small factors are left out. The tile
tiles of lanner.kernels.ops.glu (`_RANK_R_TILES`, forward and backward apart) are set per row, as a change
of them would set them; the best of each direction is printed last.
"""
from __future__ import annotations

import itertools

import torch
from triton.testing import do_bench

from lanner.kernels.ops import glu as glu_module
from lanner.kernels.ops.glu import glu_backward_in_place, glu_rank_r

TOKENS, INTERMEDIATE, RANK = 8192, 14336, 16
BF16 = torch.bfloat16
TILES = [(m, n, w) for m, n, w in itertools.product((32, 64, 128), (64, 128, 256), (4, 8)) if m * n <= 16384]


def median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def main():
    new = lambda *shape: torch.randn(*shape, device="cuda", dtype=BF16)  # noqa: E731
    gate, up, dout = new(TOKENS, INTERMEDIATE), new(TOKENS, INTERMEDIATE), new(TOKENS, INTERMEDIATE)
    terms = [(new(TOKENS, RANK), new(RANK, INTERMEDIATE) * 0.01) for _ in range(3)]
    # backward in place: each call overwrites its buffers, so it works on copies refreshed before each timing
    g2, u2, d2 = gate.clone(), up.clone(), dout.clone()
    forward_bytes, backward_bytes = 3 * gate.numel() * 2, 6 * gate.numel() * 2

    def rate(nbytes, ms):
        return f"{nbytes / (ms * 1e-3) / 1e12:.2f} TB/s"

    print("| tiles (rows x cols, warps) | forward ms | forward | backward ms | backward |")
    print("|---|---|---|---|---|")
    plain_f = median_ms(lambda: glu_rank_r(gate, up, "silu"))
    plain_b = median_ms(lambda: glu_backward_in_place(d2, g2, u2, "silu"))
    print(f"| plain GLU, no terms | {plain_f:.3f} | {rate(forward_bytes, plain_f)} | {plain_b:.3f} | "
          f"{rate(backward_bytes, plain_b)} |", flush=True)
    results = []
    for m, n, w in TILES:
        glu_module._RANK_R_TILES = {"forward": (m, n, w), "backward": (m, n, w)}
        try:
            fwd = median_ms(lambda: glu_rank_r(gate, up, "silu", terms[0], terms[1]))
            g2.copy_(gate), u2.copy_(up), d2.copy_(dout)
            bwd = median_ms(lambda: glu_backward_in_place(d2, g2, u2, "silu", *terms))
        except Exception as error:  # a tile too large for the shared memory: say so, go on
            print(f"| {m} x {n}, {w} | {type(error).__name__} | | | |", flush=True)
            continue
        results.append((fwd, bwd, m, n, w))
        print(f"| {m} x {n}, {w} | {fwd:.3f} | {rate(forward_bytes, fwd)} | {bwd:.3f} | {rate(backward_bytes, bwd)} |",
              flush=True)
    for direction, index in (("forward", 0), ("backward", 1)):
        for row in sorted(results, key=lambda row: row[index])[:3]:
            print(f"best {direction}: {row[2]} x {row[3]}, {row[4]} warps: {row[index]:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
