"""Which pass of a checkpointed decoder layer is running, for the kernels inside it.

The memory engine runs each decoder layer's forward, and later its recompute in backward, inside a
LayerRun's context (torch.utils.checkpoint's `context_fn`). The patched MLP (and MoE experts) reads
`current_layer_run()` to learn whether it may skip its down projection (recompute only) and where
to keep its matmul outputs (a `keep_mlp` layer).
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager

from ..lora import MLPStash

_local = threading.local()


class LayerRun:
    """One forward of one checkpointed decoder layer and its one recompute.

    mlp_stash: where the MLP keeps some of its matmul outputs from the forward to the recompute
    (an MLPStash on the GPU, an OffloadedStash in host memory), or None.
    skip_mlp_output: in the recompute nothing after the MLP saves for backward (true of layers that
    add the MLP output straight to the residual), so the down projection's GEMM can be skipped.
    mlp_tile_rows: the MLP runs over tiles of this many rows when the batch has more and it has no
    stash (lora.LoRAMLPFunction): long sequences then hold one tile's intermediates at a time.
    mlp_dh_tile_rows: the MLP's backward builds its dh this many rows at a time.
    after_mlp_backward: called when the MLP's backward has let go of its tensors.
    attention_keep: where the forward leaves the attention's output for the recompute to take instead of running
    the attention again (attention/kept_sdpa.py), or None.
    moe_experts_ran: set by a mixture of experts' experts, which take the stash and skip_mlp_output only
    (no tiles, no up projection in host memory), so that the planner counts on nothing more.
    """

    def __init__(self, mlp_stash: MLPStash | None, skip_mlp_output: bool, mlp_tile_rows: int | None = None,
                 mlp_dh_tile_rows: int | None = None, after_mlp_backward: Callable[[], None] | None = None,
                 attention_keep=None):
        self.mlp_stash = mlp_stash
        self.skip_mlp_output = skip_mlp_output
        self.mlp_tile_rows = mlp_tile_rows
        self.mlp_dh_tile_rows = mlp_dh_tile_rows
        self.after_mlp_backward = after_mlp_backward
        self.attention_keep = attention_keep
        self.recomputing = False
        self.moe_experts_ran = False

    @property
    def mlp_output_needed(self) -> bool:
        return not (self.recomputing and self.skip_mlp_output)

    def contexts(self):
        """torch.utils.checkpoint's context_fn: (forward context, recompute context)."""
        return self._running(recomputing=False), self._running(recomputing=True)

    @contextmanager
    def _running(self, recomputing: bool):
        previous = getattr(_local, "run", None)
        _local.run, self.recomputing = self, recomputing
        try:
            yield
        finally:
            _local.run = previous


def current_layer_run() -> LayerRun | None:
    return getattr(_local, "run", None)
