"""Budgeted recompute: what each decoder layer keeps on the GPU, recomputes or offloads.

Three ways to run a layer under the budget, from least to most memory:
- recompute: keep only the layer input (on the GPU, or offloaded to host memory) and recompute the
  whole layer in backward (the down projection's GEMM is skipped when nothing after it saves); when
  offloading, the MLP's up projection waits in host memory too, so the recompute skips its GEMM;
- keep_mlp: also keep the MLP's gate and up projections, so the recompute runs only the attention
  half (the GEMMs that cost most to recompute per byte they hold);
- keep: no checkpoint; everything the layer saves stays on the GPU and nothing is recomputed.
The planner first offloads (inputs and up projections) if the budget needs it or when asked, then spends what is left
of the budget on layers, the best seconds-saved-per-byte upgrade first, last layers first (their
backward comes first, which gives offloaded copies of earlier layers time to come back).
A plan for layers run from CUDA graphs (memory/graphs.py) offloads inputs only and keeps whole layers only: the
graphs hold neither an MLP stash nor an up projection in host memory. Their recomputed layers that offload their input
send their attention output there too where the copies hide under the forward (HOST_COPY_FLOPS_PER_BYTE): the
recompute then skips the attention forward.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

GIB = 2**30
MODES = ("recompute", "keep_mlp", "keep")
# The attention backward's own buffers, in layer inputs: fitted to the H200's measured peaks (torch's
# flash SDPA, Llama-3 8B shape, 65k to 377k tokens, docs/memory-engine.md); its float32 dq
# accumulator alone is two. They set the peak once long batches tile the MLP.
ATTENTION_BACKWARD_INPUTS = 3.5
# The CUDA graphs' pool over one layer's predicted backward: it holds that layer's working memory and the blocks
# its captures left apart (Qwen3-1.7B at 8,192 tokens on the H100: 0.71 GiB against 0.55 predicted).
GRAPH_POOL_OVER_WORKING = 1.3
# A layer's forward FLOPs per byte it sends to host memory, at least, for its attention output to go beside its input:
# the copies (55 GB/s from an H200 to pinned host memory, docs/benchmarks.md) then take no longer than the forward's
# GEMMs at ~1 PFLOP/s (FP8; twice as long at bf16's rate). Llama-3 8B's layer at any length: ~28k; Qwen2.5-1.5B's:
# ~16k at 2,048 tokens a row, ~19k at 8,192 (attention's FLOPs grow with the row).
HOST_COPY_FLOPS_PER_BYTE = 18_000


@dataclass(frozen=True)
class LayerCosts:
    """Bytes one decoder layer holds for backward (measured on its first forward), and FLOPs its recompute costs."""

    input_bytes: int  # the layer input, which a checkpoint holds
    mlp_bytes: int  # the MLP's gate/up outputs and their rank-r products (what keep_mlp adds)
    saved_bytes: int  # everything the layer saves without a checkpoint, its input included
    mlp_flops: float  # recompute FLOPs that keep_mlp saves (the gate and up GEMMs)
    rest_flops: float  # recompute FLOPs that keep saves beyond that (attention and its projections)
    tokens: int = 0  # rows of the measured batch (0: unknown, the MLP is never tiled)
    # The MLP takes the dense MLP's options: row tiles, dh tiles, its up projection in host memory. A
    # mixture of experts takes none of them (it keeps and skips GEMMs as the dense MLP does, nothing more).
    dense_mlp: bool = True
    # The attention output and log-sum-exp its recompute can take instead of computing them (0: its attention path
    # keeps none: attention/kept_sdpa.py).
    attention_bytes: int = 0

    @property
    def attention_to_host(self) -> bool:
        """Whether the attention output may go to host memory beside an offloaded input (HOST_COPY_FLOPS_PER_BYTE)."""
        forward_flops = self.mlp_flops * 3 / 2 + self.rest_flops  # (mlp_flops: gate and up, of three GEMMs)
        sent = self.input_bytes + self.attention_bytes
        return self.attention_bytes > 0 and forward_flops >= HOST_COPY_FLOPS_PER_BYTE * sent

    def tiled_by(self, mlp_tile_rows: int | None) -> bool:
        """Whether tiles of this many rows split the measured batch (None: no tiles)."""
        return self.dense_mlp and bool(mlp_tile_rows) and self.tokens > mlp_tile_rows

    def working_bytes(self, mlp_tile_rows: int | None = None, dh_tile_rows: int | None = None) -> int:
        # Backward of one layer, the larger of its two halves. The MLP's: all the layer saves
        # (recomputed or kept), the MLP's gradient dh (whose buffer then takes the recomputed
        # activation; dh_tile_rows rows at a time when given) and two hidden-size gradients; a tiled
        # MLP saves only its input: gate, up and dh exist for one tile at a time. The attention's,
        # once the MLP's tensors are gone: the rest of what the layer saves, the two gradients and
        # the attention backward's own buffers.
        saved, rows = self.saved_bytes, self.tokens
        if self.tiled_by(mlp_tile_rows):
            saved = self.saved_bytes - self.mlp_bytes + self.mlp_bytes * mlp_tile_rows // self.tokens
            rows = mlp_tile_rows
        if dh_tile_rows and self.dense_mlp:
            rows = min(rows, dh_tile_rows)
        dh = self.up_bytes * rows // self.tokens if self.tokens else self.up_bytes  # tokens unknown: whole
        mlp_half = saved + dh + 2 * self.input_bytes
        attention_half = self.saved_bytes - self.mlp_bytes + (2 + ATTENTION_BACKWARD_INPUTS) * self.input_bytes
        return max(mlp_half, int(attention_half))

    @property
    def up_bytes(self) -> int:
        return self.mlp_bytes // 2

    def scaled_to(self, tokens: int, mlp_flops: float, rest_flops: float) -> "LayerCosts":
        """The same layer on a batch of `tokens`: everything it holds is per token (FLOPs are given, as
        attention's grow faster)."""
        def scale(n):
            return n * tokens // self.tokens
        return LayerCosts(scale(self.input_bytes), scale(self.mlp_bytes), scale(self.saved_bytes), mlp_flops,
                          rest_flops, tokens, self.dense_mlp, scale(self.attention_bytes))


@dataclass(frozen=True)
class LayerPlan:
    mode: str
    offload_input: bool = False
    offload_up: bool = False  # recompute only: the up projection waits in host memory
    offload_attention: bool = False  # graphed, recomputed and offloading its input: the attention output goes too

    def host_bytes(self, costs: LayerCosts) -> int:
        return (costs.input_bytes * self.offload_input + costs.up_bytes * self.offload_up
                + costs.attention_bytes * self.offload_attention)

    def held_bytes(self, costs: LayerCosts) -> int:
        if self.mode == "keep":
            return costs.saved_bytes
        held = 0 if self.offload_input else costs.input_bytes
        return held + (costs.mlp_bytes if self.mode == "keep_mlp" else 0)


@dataclass(frozen=True)
class MemoryPlan:
    layers: tuple[LayerPlan, ...]
    costs: LayerCosts
    base_bytes: int  # weights, LoRA parameters, their gradients and optimizer state, the head's work
    budget_bytes: int | None
    mlp_tile_rows: int | None = None  # recomputed layers run their MLP over tiles of this many rows
    dh_tile_rows: int | None = None  # checkpointed layers' MLP backward builds dh this many rows at a time
    graph_bytes: int = 0  # the CUDA graphs' own buffers when the layers run graphed (memory/graphs.py)
    graphed: bool = False  # the layers run from CUDA graphs

    @property
    def tiled(self) -> bool:
        return self.costs.tiled_by(self.mlp_tile_rows)

    @property
    def predicted_peak_bytes(self) -> int:
        # The peak is a layer's MLP backward, while every layer before it still holds what it keeps:
        # the last layer's when all work alike. The previous layer's offloaded input is coming back
        # meanwhile; its up projection starts coming back only once this MLP backward is over.
        # Graphed layers do their work in the graphs' own pool, held apart from everything else: the peak is
        # then all the layers hold, the pool, and the graphs' buffers (the head's work among them); an offloaded
        # input comes back into one of the two buffers their outputs alternate in, an attention output into one of
        # two of its own.
        offloading = any(layer.offload_input for layer in self.layers)
        prefetch = self.costs.input_bytes * (1 + self.graphed) if offloading else 0
        if self.graphed:
            held = sum(layer.held_bytes(self.costs) for layer in self.layers)
            pool = GRAPH_POOL_OVER_WORKING * max(self.working_bytes(layer) for layer in self.layers)
            attention = 2 * self.costs.attention_bytes if any(layer.offload_attention for layer in self.layers) else 0
            return self.base_bytes + held + int(pool) + prefetch + attention + self.graph_bytes
        held = backward = 0
        for layer in self.layers:
            backward = max(backward, held + self.working_bytes(layer))
            held += layer.held_bytes(self.costs)
        return self.base_bytes + backward + prefetch

    def working_bytes(self, layer: LayerPlan) -> int:
        if layer.mode == "keep":  # no checkpoint: a kept layer's MLP is whole, backward too
            return self.costs.working_bytes()
        return self.costs.working_bytes(self.mlp_tile_rows if layer.mode == "recompute" else None, self.dh_tile_rows)

    @property
    def host_bytes(self) -> int:
        return sum(layer.host_bytes(self.costs) for layer in self.layers)

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.predicted_peak_bytes <= self.budget_bytes

    def describe(self) -> str:
        counts = {mode: sum(layer.mode == mode for layer in self.layers) for mode in MODES}
        offloaded = sum(layer.offload_input for layer in self.layers)
        up_offloaded = sum(layer.offload_up for layer in self.layers)
        attention_offloaded = sum(layer.offload_attention for layer in self.layers)
        budget = "none" if self.budget_bytes is None else f"{self.budget_bytes / GIB:.2f} GiB"
        lines = [
            f"lanner.kernels memory plan ({len(self.layers)} layers, budget {budget}): "
            f"predicted peak {self.predicted_peak_bytes / GIB:.2f} GiB"
            + ("" if self.fits else " - OVER BUDGET: the smallest plan does not fit"),
            f"  keep (no recompute): {counts['keep']} layers, {self.costs.saved_bytes / GIB:.3f} GiB each",
            f"  keep_mlp (recompute attention only): {counts['keep_mlp']} layers, "
            f"+{self.costs.mlp_bytes / GIB:.3f} GiB each",
            f"  recompute: {counts['recompute']} layers; in host memory: {offloaded} layer inputs "
            f"({self.costs.input_bytes / GIB:.3f} GiB each), {up_offloaded} up projections "
            f"({self.costs.up_bytes / GIB:.3f} GiB each), {attention_offloaded} attention outputs "
            f"({self.costs.attention_bytes / GIB:.3f} GiB each), {self.host_bytes / GIB:.2f} GiB in all",
            f"  base (weights, LoRA + optimizer, head) {self.base_bytes / GIB:.2f} GiB, "
            f"one layer's backward {self.working_bytes(self.layers[0]) / GIB:.2f} GiB"
            + (f" (MLP in tiles of {self.mlp_tile_rows} tokens)" if self.tiled else "")
            + (f", CUDA graphs' buffers {self.graph_bytes / GIB:.2f} GiB" if self.graphed else ""),
            "  per layer: " + " ".join(_short(layer) for layer in self.layers),
        ]
        return "\n".join(lines)


def _within_host_memory(layers: list[LayerPlan], costs: LayerCosts, host_bytes: int | None) -> tuple[LayerPlan, ...]:
    if host_bytes is None or sum(layer.host_bytes(costs) for layer in layers) <= host_bytes:
        return tuple(layers)
    inputs_room = host_bytes // max(costs.input_bytes, 1)
    limited = []
    for layer in layers:
        offload_input = layer.offload_input and inputs_room > 0
        inputs_room -= offload_input
        limited.append(replace(layer, offload_input=offload_input, offload_up=False, offload_attention=False))
    return tuple(limited)


def _short(layer: LayerPlan) -> str:
    return layer.code


LayerPlan.code = property(lambda self: {"keep": "K", "keep_mlp": "M", "recompute": "R"}[self.mode]
                          + ("o" if self.offload_input else "") + ("u" if self.offload_up else "")
                          + ("a" if self.offload_attention else ""))


def plan_memory(n_layers: int, costs: LayerCosts, base_bytes: int, budget_bytes: int | None = None,
                offload: bool | None = None, mlp_tile_rows: int | None = None,
                dh_tile_rows: int | None = None, host_bytes: int | None = None,
                graph_bytes: int | None = None) -> MemoryPlan:
    """The plan for n_layers identical decoder layers.

    budget_bytes None: every layer recomputes (plain checkpointing), inputs offloaded if offload is True,
    or is None and the layers run graphed (their copies overlap compute inside the graphs: 0.7-1.8% slower,
    2.3-2.7 GiB less at the 7-8B shapes, docs/benchmarks.md's thirty-first round). offload: True always
    offloads the inputs of recomputed layers, False never, None when the budget needs it (or, with no
    budget, when graphed). Offloading moves the inputs of checkpointed layers and the up
    projections of recomputed ones to host memory. The last layer offloads nothing: it is
    recomputed first, right after the forward, so a copy would only stall the start of backward.
    mlp_tile_rows: recomputed layers run their MLP over tiles of this many rows when the batch has
    more (their up projection then stays out of host memory: backward recomputes it tile by tile).
    When the budget is still exceeded with everything offloaded, smaller tiles (halving, down to
    1,024 rows) are tried: each tile's intermediates, not the whole batch's, are then held.
    dh_tile_rows: the MLP backward of checkpointed layers builds dh this many rows at a time.
    host_bytes: the host memory offloading may take (None: no limit). Beyond it the up projections
    stay on the GPU, then the inputs of the last layers that would offload.
    graph_bytes: not None, a plan for layers run from CUDA graphs, whose own buffers take this many bytes: no up
    projection in host memory, no keep_mlp; recomputed layers that offload their input send their attention output
    too where LayerCosts.attention_to_host.
    """
    if n_layers < 1:
        raise ValueError("plan_memory: a model with no decoder layers")
    if budget_bytes is not None and budget_bytes <= 0:
        raise ValueError(f"plan_memory: the memory budget must be positive, got {budget_bytes} bytes")

    graphed = graph_bytes is not None

    def layer_plan(i, mode, offload_inputs, tiled):
        offload_here = offload_inputs and i < n_layers - 1
        recomputed = offload_here and mode == "recompute"
        return LayerPlan(mode, offload_here and mode != "keep",
                         recomputed and not tiled and costs.dense_mlp and not graphed,
                         recomputed and graphed and costs.attention_to_host)

    def plan_of(modes, offload_inputs, tile_rows):
        tiled = costs.tiled_by(tile_rows)
        layers = [layer_plan(i, mode, offload_inputs, tiled) for i, mode in enumerate(modes)]
        return MemoryPlan(_within_host_memory(layers, costs, host_bytes), costs, base_bytes, budget_bytes,
                          tile_rows, dh_tile_rows, graph_bytes or 0, graphed)

    modes = ["recompute"] * n_layers
    offload_inputs = bool(offload) or (offload is None and budget_bytes is None and graphed)
    plan = plan_of(modes, offload_inputs, mlp_tile_rows)
    if budget_bytes is None:
        return plan
    if not plan.fits and offload is None:
        offload_inputs = True
        plan = plan_of(modes, offload_inputs, mlp_tile_rows)
    tile_rows = min(mlp_tile_rows or costs.tokens, costs.tokens)
    while not plan.fits and tile_rows // 2 >= 1024:
        tile_rows //= 2
        plan = plan_of(modes, offload_inputs, tile_rows)
    if not plan.fits:
        return plan

    # Upgrades, the better FLOPs-saved-per-byte first; layers are identical, so the first that does
    # not fit ends a pass.
    def bytes_to(src, dst):
        return (layer_plan(0, dst, offload_inputs, plan.tiled).held_bytes(costs)
                - layer_plan(0, src, offload_inputs, plan.tiled).held_bytes(costs))

    # With the up projection in host memory, keeping the MLP on the GPU saves only the gate GEMM. A mixture of
    # experts offloads no up projection, so for it this halving undervalues keep_mlp in FLOPs; it stays, because
    # a kept whole layer also takes its recompute's launches off the host, which an MoE step waits on and FLOPs
    # do not count (the plan it gives, whole layers first, is the one measured: docs/benchmarks.md, round 18).
    mlp_gain = costs.mlp_flops / 2 if offload_inputs and not plan.tiled else costs.mlp_flops
    mlp_rate = mlp_gain / max(bytes_to("recompute", "keep_mlp"), 1)
    rest_rate = costs.rest_flops / max(bytes_to("keep_mlp", "keep"), 1)
    passes = [("recompute", "keep_mlp"), ("keep_mlp", "keep")]
    if rest_rate > mlp_rate:
        passes = [("recompute", "keep"), ("recompute", "keep_mlp")]
    # An MLP off the kernels keeps nothing for its recompute (keep_mlp saves nothing); graphs hold no MLP stash.
    if costs.mlp_bytes == 0 or graphed:
        passes = [("recompute", "keep")]
    for src, dst in passes:
        for i in reversed(range(n_layers)):
            if modes[i] != src:
                continue
            trial = modes[:i] + [dst] + modes[i + 1:]
            candidate = plan_of(trial, offload_inputs, plan.mlp_tile_rows)
            if not candidate.fits:
                break
            modes, plan = trial, candidate
    return plan
