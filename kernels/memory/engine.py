"""The memory engine: runs each decoder layer under the plan (keep, keep_mlp or recompute, with its
input on the GPU or in host memory), planning once the first training forward shows the batch size.

It takes the place of transformers' checkpoint function on each decoder layer
(`_gradient_checkpointing_func`, which GradientCheckpointingLayer calls as func(forward, hidden_states)
in training with checkpointing on), and puts itself back if a trainer calls
gradient_checkpointing_enable again.
"""
from __future__ import annotations

import functools
import logging
import os
import platform
from contextlib import contextmanager

import psutil
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..lora import MLPStash
from ..ops.fused_linear_ce import work_bytes as loss_work_bytes
from ..quant.fp8 import reserve_transposed_buffer
from .graphs import LayerGraphs, graph_buffer_bytes, graphs_wanted
from .host_embedding import move_input_embeddings_to_host
from .layer_run import LayerRun
from .offload import HostOffloader, OffloadedStash
from .planner import GIB, LayerCosts, MemoryPlan, plan_memory

logger = logging.getLogger("lanner.kernels")
# torch's checkpoint, non-reentrant, without its check that the recompute saved tensors of the same shapes and
# dtypes as the forward: the check compares every saved tensor's metadata in Python in every layer's backward
# (~0.3 ms a layer on the H200's host, which the FP8 and MoE steps wait on), and a recompute that differed
# would fail in the backward that reads it.
_CHECKPOINT_OPTIONS = dict(use_reentrant=False, determinism_check="none")
# Recomputed layers run their MLP over tiles of this many tokens when a batch has more: at 8,192
# tokens the tiles' GEMMs are as efficient as whole ones, and the MLP's (tokens, intermediate)
# tensors stop growing with the sequence (docs/memory-engine.md, "Long context"). A budget that
# needs it gets smaller tiles (planner.plan_memory).
MLP_TILE_ROWS = 8192
# Checkpointed layers' MLP backward builds dh (tokens x intermediate) this many rows at a time:
# -168 MiB of peak at 8,192 tokens on the 8B shape; 2,048-row GEMMs keep the tensor cores full.
DH_TILE_ROWS = 2048
_ENGINE_ATTR = "_lanner_memory_engine"


def _storage_key(t: torch.Tensor):
    return t.untyped_storage().data_ptr(), t.device


class MemoryEngine:
    def __init__(self, model: nn.Module, layers, budget_bytes: int | None, offload: bool | None):
        self.model, self.layers = model, list(layers)
        self.budget_bytes, self.offload = budget_bytes, offload
        self.plan: MemoryPlan | None = None
        self.planned_tokens = 0
        self.offloader = HostOffloader()
        self.graphs = LayerGraphs() if graphs_wanted() and not _draws_random(model) else None
        self.graphs_allowed = False  # by the plan: see _make_plan
        self.install()

    def install(self) -> None:
        for index, layer in enumerate(self.layers):
            layer._gradient_checkpointing_func = functools.partial(self.run_layer, index)
            layer.gradient_checkpointing = True

    # The checkpoint function of one layer.
    def run_layer(self, index: int, forward, hidden_states, *args):
        if not torch.is_grad_enabled():
            return forward(hidden_states, *args)
        if index == 0:
            self.offloader.begin_step()
        tokens = hidden_states.numel() // hidden_states.shape[-1]
        if self.plan is None or tokens > self.planned_tokens:
            self._make_plan(forward, hidden_states, args, tokens)
        layer_plan = self.plan.layers[index]
        skip_mlp_output = not hasattr(self.layers[index], "post_feedforward_layernorm")
        if self.graphs_allowed:
            run_factory = None if layer_plan.mode == "keep" else functools.partial(
                LayerRun, None, skip_mlp_output, self.plan.mlp_tile_rows, self.plan.dh_tile_rows)
            out = self.graphs.run(index, self.layers[index], forward, hidden_states, args, run_factory)
            if out is not None:
                return out
        if layer_plan.mode == "keep":
            return forward(hidden_states, *args)
        if layer_plan.mode == "keep_mlp":
            stash = MLPStash(("gate", "up"))
        elif layer_plan.offload_up:  # (never in a tiled plan: its MLP recomputes up tile by tile)
            stash = OffloadedStash(self.offloader, ("up",))
        else:
            stash = None
        previous_up_offloaded = index > 0 and self.plan.layers[index - 1].offload_up
        run = LayerRun(stash, skip_mlp_output=skip_mlp_output,
                       mlp_tile_rows=self.plan.mlp_tile_rows, mlp_dh_tile_rows=self.plan.dh_tile_rows,
                       after_mlp_backward=self.offloader.prefetch_last_stash if previous_up_offloaded else None)
        if not layer_plan.offload_input:
            return checkpoint(forward, hidden_states, *args, **_CHECKPOINT_OPTIONS, context_fn=run.contexts)
        held = self.offloader.hold(hidden_states)
        out = checkpoint(_forward_held, forward, held, *args, **_CHECKPOINT_OPTIONS, context_fn=run.contexts)
        held.release()
        return out

    def _make_plan(self, forward, hidden_states, args, tokens) -> None:
        # What is free, what this engine's buffers hold, less a tenth for the rest of the process.
        host_room = (host_memory_available() + self.offloader.host_bytes()) * 9 // 10
        if self.plan is not None and self.plan.costs.tokens:
            # A longer batch: scaled from the first measurement, not measured again. Measuring runs the
            # first layer without a checkpoint, which at 100k+ tokens alone needs more than the step.
            costs = self.plan.costs.scaled_to(tokens, **_recompute_flops(self.model.config, hidden_states))
            self.offloader.drop_buffers()
        else:
            costs = self._measure(forward, hidden_states, args, tokens)
        # After the measuring forward and a first backward matmul: what the first matmuls allocate for
        # good is then counted (a 4-bit model's dequantisation buffer, 112 MiB at 8B; GEMM workspace of
        # autograd's backward thread, +32 MiB on the H200, of 2 x 64 MiB that appear in the first step; an FP8
        # base's transposed codes, which its first backward product would allocate).
        if hidden_states.is_cuda:
            _run_backward_matmuls(hidden_states)
            reserve_transposed_buffer(self.model)
        base = self._base_bytes()
        planned = functools.partial(plan_memory, len(self.layers), costs, base, self.budget_bytes, self.offload,
                                    MLP_TILE_ROWS, DH_TILE_ROWS, host_room)
        # A plan for graphed layers where graphs can run (no MoE experts, a batch that is neither padded nor packed)
        # and it fits the budget with the graphs' buffers: graphs take the host's launches out of every step, worth
        # more than an MLP kept for its recompute or an up projection in host memory, which they cannot hold
        # (memory/graphs.py).
        graphed = None
        if self.graphs is not None and costs.dense_mlp and self.graphs.could_run(forward, hidden_states, args):
            graphed = planned(graph_bytes=graph_buffer_bytes(costs.input_bytes, self.layers,
                                                             self._head_bytes(hidden_states, tokens)))
        self.plan = graphed if graphed is not None and graphed.fits else planned()
        self.planned_tokens = tokens
        self.graphs_allowed = self.plan.graphed
        if self.graphs is not None:
            self.graphs.new_plan([i for i, layer in enumerate(self.plan.layers) if layer.offload_input],
                                 [i for i, layer in enumerate(self.plan.layers) if layer.offload_attention])
        print(self.plan.describe(), flush=True)
        if not self.plan.fits:
            logger.warning("lanner.kernels: the memory budget is below the smallest plan's predicted peak")

    def _measure(self, forward, hidden_states, args, tokens: int) -> LayerCosts:
        """Runs the first layer once without a checkpoint, counting the bytes it saves for backward."""
        params = {_storage_key(p) for p in self.model.parameters()}
        saved: dict = {}

        def pack(t):
            key = _storage_key(t)
            if key not in params:
                saved[key] = t.untyped_storage().nbytes()
            # Not t itself: a saved output would then hold its own grad_fn, a cycle through autograd's
            # C++ that Python's collector cannot break, keeping this forward alive for the whole run.
            return t.detach()

        attention = _AttentionBytes()
        run = LayerRun(MLPStash(("gate", "up")), skip_mlp_output=False, attention_keep=attention)
        x = hidden_states.detach().requires_grad_(hidden_states.requires_grad)
        # The random state is put back afterwards: a forward that draws (LoRA or attention dropout) must draw
        # in the step what it would have drawn without this extra forward, as plain PEFT does.
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), run.contexts()[0], \
                _outputs_not_recorded(), _random_state_kept(hidden_states.device):
            forward(x, *args)
        stash = run.mlp_stash.take() or {}
        kept = [t for value in stash.values() for t in (value if isinstance(value, tuple) else (value,))]
        mlp_bytes = sum(t.numel() * t.element_size() for t in kept if isinstance(t, torch.Tensor))
        del stash, kept
        return LayerCosts(
            input_bytes=hidden_states.numel() * hidden_states.element_size(),
            mlp_bytes=mlp_bytes,
            saved_bytes=sum(saved.values()),
            tokens=tokens,
            dense_mlp=not run.moe_experts_ran,
            attention_bytes=attention.bytes,
            **_recompute_flops(self.model.config, hidden_states),
        )

    def _head_bytes(self, hidden_states, tokens: int) -> int:
        """What the head allocates on a batch of `tokens`: the final norm's output and the fused loss's work."""
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        vocab = head.weight.shape[0] if head is not None else getattr(self.model.config, "vocab_size", 0)
        hidden, size = hidden_states.shape[-1], hidden_states.element_size()
        return tokens * hidden * size + loss_work_bytes(tokens, vocab, hidden, size)

    def _base_bytes(self) -> int:
        """Memory the layers' activations come on top of: what is allocated now (weights, LoRA), plus the
        LoRA gradients and two optimizer states (AdamW's) if they do not exist yet."""
        params = list(self.model.parameters())
        device = params[0].device
        missing = sum(3 * p.numel() * p.element_size() for p in params if p.requires_grad and p.grad is None)
        if device.type == "cuda":
            return torch.cuda.memory_allocated(device) + missing
        return sum(p.numel() * p.element_size() for p in params) + missing


class _AttentionBytes:
    """The measuring forward's store for the attention output (attention/kept_sdpa.py): what it would keep, counted."""

    bytes = 0

    def store(self, out, lse, extras) -> None:
        self.bytes = sum(t.numel() * t.element_size() for t in (out, lse))

    def take(self):
        return None


@contextmanager
def _random_state_kept(device: torch.device):
    """The CPU's random state and the device's (when it has one of its own) as they were, after the block."""
    accelerator = None if device.type == "cpu" else torch.get_device_module(device.type)
    states = torch.get_rng_state(), accelerator.get_rng_state(device) if accelerator else None
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        if accelerator:
            accelerator.set_rng_state(states[1], device)


@contextmanager
def _outputs_not_recorded():
    """transformers records layer outputs (an MoE router's logits for the load-balancing loss, hidden
    states) through hooks while the model's forward runs; the measuring forward must not add a second
    copy of the first layer's."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:  # a transformers without output capturing records nothing here
        yield
        return
    token = _active_collector.set(None)
    try:
        yield
    finally:
        _active_collector.reset(token)


def host_memory_available() -> int:
    """Bytes of host memory this process can still take: what the system reports available (as the
    worker's free_memory reads it), or less where a cgroup v2 limit (a container's) allows less."""
    available = psutil.virtual_memory().available
    try:
        with open("/sys/fs/cgroup/memory.max") as limit, open("/sys/fs/cgroup/memory.current") as used:
            available = min(available, int(limit.read()) - int(used.read()))
    except (OSError, ValueError):  # no cgroup v2, or no limit ("max")
        pass
    return max(available, 0)


def _run_backward_matmuls(like: torch.Tensor) -> None:
    """A tiny matmul backward: autograd runs backward on its own thread, whose cuBLAS handles allocate
    their workspaces at that thread's first GEMMs."""
    with torch.enable_grad():
        a = torch.ones(16, 16, device=like.device, dtype=like.dtype, requires_grad=True)
        torch.addmm(torch.ones(16, device=like.device, dtype=like.dtype), a, a.t()).sum().backward()


def _draws_random(model: nn.Module) -> bool:
    """Dropout anywhere in training (attention's, LoRA's): a graph would replay one draw, so no graphs."""
    config = getattr(model, "config", None)
    if getattr(config, "attention_dropout", 0) or getattr(config, "hidden_dropout", 0):
        return True
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules())


def _forward_held(forward, held, *args):
    return forward(held.get(), *args)


def _recompute_flops(config, hidden_states) -> dict:
    *batch, seq, hidden = hidden_states.shape
    tokens = hidden_states.numel() // hidden
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    # A mixture of experts runs each token through its top-k experts' MLPs (Qwen3-MoE's intermediate_size is
    # that of its dense layers; its experts' is moe_intermediate_size).
    experts_per_token = getattr(config, "num_experts_per_tok", None) or 1
    intermediate = (getattr(config, "moe_intermediate_size", None) or config.intermediate_size) * experts_per_token
    projections = 2 * tokens * hidden * (heads + 2 * kv_heads) * head_dim + 2 * tokens * heads * head_dim * hidden
    attention = 2 * tokens * seq * heads * head_dim  # causal: half of 4 * T * S * H * D
    return dict(mlp_flops=2 * 2 * tokens * hidden * intermediate, rest_flops=projections + attention)


def install_memory_engine(model: nn.Module, budget_gib: float | None = None,
                          offload: bool | None = None) -> MemoryEngine | None:
    """Runs the decoder layers of a (PEFT-wrapped or plain) transformers causal LM under the memory
    engine. Turns on gradient checkpointing (non-reentrant) if it is off. Returns None, with one log
    line, when the model's layers do not use transformers' checkpointing hook."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(base, getattr(base, "base_model_prefix", ""), None)
    layers = list(getattr(backbone, "layers", None) or [])
    if not layers or not all(hasattr(layer, "gradient_checkpointing") for layer in layers):
        logger.warning("lanner.kernels: no checkpointable decoder layers in %s; the memory engine is off",
                       type(base).__name__)
        return None
    if not any(layer.gradient_checkpointing for layer in layers):
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    budget = None if budget_gib is None else int(budget_gib * GIB)
    if any(p.is_cuda for p in base.parameters()):
        use_expandable_segments()
    if offload:  # the smallest footprint asked for: the frozen embedding table goes to host memory too
        moved = move_input_embeddings_to_host(base)
        if moved:
            print(f"lanner.kernels: input embeddings ({moved / GIB:.2f} GiB) read from pinned host memory", flush=True)
    engine = MemoryEngine(base, layers, budget, offload)
    object.__setattr__(base, _ENGINE_ATTR, engine)
    # Trainers turn checkpointing on again (transformers' function would replace the engine's).
    for name in ("gradient_checkpointing_enable", "activation_checkpointing_enable"):
        if hasattr(base, name):
            setattr(base, name, _reinstalling(getattr(base, name), engine))
    return engine


# The CUDA allocator's settings the engine's plans are made for, unless PYTORCH_CUDA_ALLOC_CONF says otherwise.
ALLOCATOR_SETTINGS = "expandable_segments:True"


def use_expandable_segments() -> None:
    """Segments that grow in place (ALLOCATOR_SETTINGS), so that what the process reserves stays near what the plan
    predicts it allocates. With fixed-size segments the blocks freed between a step's phases were split and cached
    beyond that: 0.6-1.1 GiB reserved but unallocated at Qwen3-1.7B, 8,192 tokens, where a CUDA graph's capture,
    which cannot free cached blocks, then failed under a memory cap that the graphed plan fits (docs/benchmarks.md,
    twenty-eighth round). Only segments made after the switch grow in place, and the holes that loading a model
    leaves in fixed ones stay reserved (0.45 GiB at Qwen2.5-1.5B built in float32 and cast: capture out of memory
    under the same cap, twenty-ninth round), so get_lora_model and the worker call this before they load, and the
    memory engine again for a model loaded elsewhere. A setting of the user's (either environment variable) is
    left as it is; so is WSL, where the driver's virtual memory calls that such segments need fail."""
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        return
    if "microsoft" in platform.release().lower():
        return
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)  # (torch.cuda.memory's is deprecated)
    try:
        (setter or torch.cuda.memory._set_allocator_settings)(ALLOCATOR_SETTINGS)
    except (AttributeError, RuntimeError) as error:  # an allocator without them (cudaMallocAsync): plain segments
        logger.info("lanner.kernels: CUDA allocator settings %s not applied (%s)", ALLOCATOR_SETTINGS, error)


def _reinstalling(enable, engine):
    @functools.wraps(enable)
    def enable_and_reinstall(*args, **kwargs):
        enable(*args, **kwargs)
        engine.install()

    return enable_and_reinstall


def memory_engine_of(model: nn.Module) -> MemoryEngine | None:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, _ENGINE_ATTR, None)
