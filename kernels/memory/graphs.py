"""CUDA graphs of recomputed decoder layers: each layer's forward, and its recompute with backward, replayed
from one graph apiece instead of ~150 launches and ~900 host-side ops.

Small models' steps are host-bound: Qwen2.5-1.5B at 8,192 tokens kept the H100 busy 170 ms of a 300 ms
step, the rest waiting on Python, PEFT's dispatch, autograd and ~860 aten ops per layer (docs/benchmarks.md,
twenty-fourth round). A graph replays a layer's kernels with no host work.

What a graph needs, and what is done when it is not there:
- the same shapes each step: graphs are made for one batch shape (and first-layer state) at a time, once it has
  come twice in a row; another shape runs the ordinary checkpoint (a run of batches of varying shapes keeps the
  ordinary path, after three changes for good);
- a layer whose inputs are tensors, plain values and the "lanner" attention's layout of a whole causal sequence
  with no padding or packing (a packed or padded batch carries per-batch tensors inside the layout: ordinary path);
- a plan made for graphs (planner.plan_memory's graph_bytes): layers recomputed, their inputs on the GPU or in host
  memory, or kept whole; no MoE experts (their routing is data-dependent), no dropout: the engine asks only then
  (MemoryEngine.graphs_allowed);
- no CPU synchronisation inside the layer: a capture that fails turns graphs off for the run, in one log line;
- weights that stay where they are (FSDP gathers sharded ones anew each step): graphs end when one has moved.

Each graph reads fixed buffers: a layer's input is the previous layer's graph output (no copy), the first
layer's and the other tensors a layer takes (RoPE tables) are copied in once a forward, the input gradient
alternates between two buffers down the layers. All graphs of a shape share one memory pool, captured in the
order they replay (forwards up, backwards down), so their working memory is one layer's; unlike the ordinary
path's, the rest of the step (the head, the loss) cannot use it (graph_pool_free_bytes).

A recomputed layer's graphs run its forward without autograd, and its recompute with backward. A kept layer's
forward graph records autograd as the ordinary forward does (what it saves for backward lives in the pool from its
capture on) and its backward graph differentiates that record (make_graphed_callables' way).

Offloaded inputs: where the plan puts layer i's input in host memory, layer i-1 writes its output into one of two
buffers the layers alternate in, layer i's forward graph copies its input to pinned host memory on a side stream
while it computes, and layer i+1's backward graph copies it back into the same buffer while it recomputes (layer
i's own backward copies it in first where that did not happen). The first layer's input stays in its buffer.
A forward whose layer still waits for the backward of the previous one (two forwards before a backward, as some
preference trainers run) takes the ordinary path for that call.

Kept attention: where the plan also puts a layer's attention output in host memory (LayerPlan.offload_attention, a
subset of the offloaded inputs), the layer's forward graph copies that output and its log-sum-exp there on the same
side stream, and the backward graph of the layer above brings them back beside the input, into one of two buffers
the layers alternate in; the layer's recompute then takes them instead of running the attention forward
(attention/kept_sdpa.py).
"""
from __future__ import annotations

import functools
import logging
import os
import warnings
import weakref
from contextlib import contextmanager, nullcontext

import torch

from ..attention.core import window_block_masks
from ..attention.transformers_glue import AttentionLayout
from ..lora import factor_casts_uncached
from ..peft_projections import adapter_state
from ..quant.quantised_linear import shared_buffers
from .offload import pinned_empty

logger = logging.getLogger("lanner.kernels")
# A shape is graphed once it has come this many times in a row; after this many shape changes that dropped
# graphs, the run keeps the ordinary path.
_REPEATS_BEFORE_CAPTURE = 2
_MAX_DROPS = 3


def graphs_wanted() -> bool:
    """LANNER_CUDA_GRAPHS=0 turns layer graphs off (on by default where CUDA is)."""
    return os.environ.get("LANNER_CUDA_GRAPHS", "1") != "0" and torch.cuda.is_available()


def graph_buffer_bytes(input_bytes: int, layers, head_bytes: int) -> int:
    """What graphed layers hold beyond the ordinary path at its peak: the first layer's input, the top gradient and
    the two input-gradient buffers, each layer's parameter gradients (copied to .grad from there), and the head's
    work (the loss's and the final norm's), which the layers' working memory no longer shares (it stays in the
    graphs' pool)."""
    grads = sum(p.numel() * p.element_size() for layer in layers for p in layer.parameters() if p.requires_grad)
    return 4 * input_bytes + grads + head_bytes


def graph_pool_free_bytes() -> int:
    """Bytes the CUDA-graph memory pools hold beyond their live tensors: the graphs' working memory. A replay
    allocates nothing, so torch.cuda.max_memory_allocated() never counts it, yet no other allocation can use it:
    a step's peak on the device is the allocated peak plus this."""
    if not torch.cuda.is_available():
        return 0
    return sum(segment["total_size"] - segment["allocated_size"] for segment in torch.cuda.memory_snapshot()
               if tuple(segment["segment_pool_id"]) != (0, 0))


def device_peak_bytes() -> int:
    """The GPU memory peak since the last reset of the allocator's peak statistics, the graphs' working memory
    included."""
    return torch.cuda.max_memory_allocated() + graph_pool_free_bytes()


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _capture_stream() -> torch.cuda.Stream:
    """The stream graphs are captured on: one per device for the process. cuBLAS keeps a workspace for each stream
    (and thread) it has run on until the process ends, so a stream per set of graphs left some behind at every new
    batch shape or model."""
    device = torch.cuda.current_device()
    if device not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device] = torch.cuda.Stream()
    return _CAPTURE_STREAMS[device]


class _NotGraphable(Exception):
    pass


def _signature(value):
    """What a graph captured from `value` depends on, hashable; raises _NotGraphable for what it cannot hold."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise _NotGraphable("a layer argument other than the hidden states needs a gradient")
        return _described(value)
    if isinstance(value, (tuple, list)):
        return type(value).__name__, tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return "dict", tuple((k, _signature(v)) for k, v in value.items())
    if isinstance(value, AttentionLayout):
        if not value.whole_sequence or value.padding is not None or value.segments is not None:
            raise _NotGraphable("a padded or packed batch")
        return "layout", value.q_length, value.kv_length, value.window
    raise _NotGraphable(f"a layer argument of type {type(value).__name__}")


def _on_graph_device(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda  # (a model on the CPU in a process with a GPU: its ops would not be captured)


def _no_token():
    return None


def _described(tensor: torch.Tensor):
    return "tensor", tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device


class _Token:
    """Lives as long as the autograd node of one graphed forward (which a loss kept after its backward keeps alive)."""


class _ShapeGraphs:
    """The graphs of every layer for one batch shape, and the buffers they share."""

    def __init__(self, key, owner: "LayerGraphs"):
        self.key, self.owner = key, owner
        self.fresh = True  # no step has replayed these graphs yet
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = _capture_stream()
        self.layers: dict[int, _LayerGraph] = {}
        # Static copies of the layers' tensor arguments: one per tensor a forward passes (layers given the same
        # tensor share its copy; Gemma 3's local and global RoPE tables get one each), with the tensor last
        # copied into it, that tensor's version and the forward it was copied in.
        self.arg_buffers: list[list] = []  # [[buffer, source, version, forward]]
        self.forwards = 0  # graphed forwards begun
        self.first_input: torch.Tensor | None = None
        self.grad_buffers: list[torch.Tensor] = []  # [top gradient, input gradient of even, of odd layers]
        # Offloaded inputs (see the module docstring): the layers whose input goes to host memory, the two buffers
        # their inputs alternate in, each one's host copy, the stream of the copies and the layer whose input the
        # last backward graph brought back.
        self.offloaded = owner.offloaded
        self.attention_offloaded = owner.attention_offloaded
        self.ring: list[torch.Tensor] = []
        self.attention_ring: list[tuple] = []  # two (output, log-sum-exp) buffers for kept attention
        self.host: dict[int, torch.Tensor] = {}
        self.copy_stream = torch.cuda.Stream()
        self.prefetched: int | None = None
        self.warmed_backwards: list = []  # the kinds of layer whose backward ran eagerly (warm_up_backward)
        # What the graphs may read or write outside their pool and a cache could let go of: the quantised layers'
        # scratch buffers, FlexAttention's window masks.
        self.kept: list = []

    def outputs(self):
        return {layer.static_out.data_ptr(): layer for layer in self.layers.values()}

    def pending(self) -> bool:
        return any(layer.pending() for layer in self.layers.values())

    def static_kwargs(self, kwargs: dict):
        """(kwargs with each tensor replaced by its static copy, [(path, copy's entry)]) for a layer's capture."""
        links = []

        def static(path, tensor):
            entry = next((e for e in self.arg_buffers if e[1] is tensor), None)
            if entry is None:
                buffer = torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype, device=tensor.device)
                buffer.copy_(tensor)
                entry = [buffer, tensor, tensor._version, self.forwards]
                self.arg_buffers.append(entry)
            links.append((path, entry))
            return entry[0]
        return _map_tensors(kwargs, static), links

    def grad_buffer(self, like: torch.Tensor, which: int) -> torch.Tensor:
        return _nth_buffer(self.grad_buffers, like, which)

    def ring_buffer(self, like: torch.Tensor, which: int) -> torch.Tensor:
        return _nth_buffer(self.ring, like, which)

    def host_copy(self, index: int, like: torch.Tensor) -> torch.Tensor:
        if index not in self.host:
            self.host[index] = _host_like(like)
        return self.host[index]

    def attention_buffers(self, like: tuple, which: int, device: torch.device) -> tuple:
        """The `which`th of the two buffers on `device` kept attention comes back into, shaped and strided like
        `like`."""
        while len(self.attention_ring) <= which:
            self.attention_ring.append(tuple(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
                                             for t in like))
        return self.attention_ring[which]


def _host_like(like: torch.Tensor) -> torch.Tensor:
    """A host buffer shaped and strided like `like` (a dense layout, such as the attention output's heads-major view
    of a tokens-major tensor, is copied in one piece): pinned for a CUDA tensor."""
    stride = torch.empty_like(like, device="meta").stride()  # like's own where dense, else contiguous
    if not like.is_cuda:
        return torch.empty_strided(like.shape, stride, dtype=like.dtype)
    return pinned_empty(like.numel(), like.dtype).as_strided(like.shape, stride)


class _KeptAttention:
    """One graphed layer's attention output and log-sum-exp, from its forward to its recompute by way of host memory
    (the module docstring; the `kept` of attention/kept_sdpa.py)."""

    def __init__(self, shape: "_ShapeGraphs", index: int):
        self.shape, self.index = shape, index
        self.host: tuple = ()  # (output, log-sum-exp) in pinned host memory
        self.extras = None  # the kernel's other outputs (sizes, empty random-state tensors) of the captured forward
        self.device: torch.device | None = None
        self.held: tuple = ()  # the forward's tensors, until the layer's forward has waited for their copies

    def store(self, out: torch.Tensor, lse: torch.Tensor, extras) -> None:
        if not self.host:
            self.host = tuple(_host_like(t) for t in (out, lse))
        self.extras, self.held, self.device = extras, (out, lse), out.device
        stream = self.shape.copy_stream
        if stream is None:  # (the tests' CPU stand-in)
            for host, tensor in zip(self.host, self.held):
                host.copy_(tensor)
            return
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for host, tensor in zip(self.host, self.held):
                host.copy_(tensor, non_blocking=True)

    def copied(self) -> None:
        """The layer's forward has waited for the copies: the forward's tensors may go."""
        self.held = ()

    def take(self):
        """(output, log-sum-exp, extras) where they come back, or None before any forward stored them."""
        if self.extras is None:
            return None
        # (Aliases: autograd marks what the attention returns as its output, which the buffers must not become.)
        return (*(buffer.detach() for buffer in self.buffers()), self.extras)

    def buffers(self) -> tuple:
        return self.shape.attention_buffers(self.host, self.index % 2, self.device)

    def copies_back(self) -> list:
        """[(GPU buffer, host copy)] that bring them back; none before any forward stored them."""
        return list(zip(self.buffers(), self.host)) if self.host else []


def _nth_buffer(buffers: list, like: torch.Tensor, which: int) -> torch.Tensor:
    """buffers[which], the list grown with contiguous buffers shaped like `like` as far as needed."""
    while len(buffers) <= which:
        buffers.append(torch.empty_like(like, memory_format=torch.contiguous_format))
    return buffers[which]


@contextmanager
def _copying_beside(stream, copies):
    """Each (destination, source) of copies copied on `stream` while the block runs on the current one, which waits
    for them at its end (under capture, a fork and a join of the graph). Without a stream (the tests' CPU stand-in),
    plain copies first."""
    if stream is None or not copies:
        for dst, src in copies:
            dst.copy_(src)
        yield
        return
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for dst, src in copies:
            dst.copy_(src, non_blocking=True)
    try:
        yield
    finally:
        torch.cuda.current_stream().wait_stream(stream)


@torch.no_grad()
def _copy_in_arguments(kwargs: dict, links, forward: int) -> bool:
    """A layer's tensor arguments into its static copies, unless already there (its layers share them). False
    when a copy that layers shared at the capture was given another tensor earlier in this forward: the backward
    graphs read the copies, so layers that now take different tensors cannot share one."""
    for path, entry in links:
        tensor = kwargs
        for part in path:
            tensor = tensor[part]
        if entry[1] is not tensor or entry[2] != tensor._version:
            if entry[3] == forward:
                return False
            entry[0].copy_(tensor)
            entry[1], entry[2], entry[3] = tensor, tensor._version, forward
    return True


def _map_tensors(value, fn, path=()):
    if isinstance(value, torch.Tensor):
        return fn(path, value)
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, fn, (*path, i)) for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn, (*path, k)) for k, v in value.items()}
    return value


class _LayerGraph:
    """One layer's forward graph (captured at its first graphed forward) and backward graph (at its first backward)."""

    def __init__(self, shape: _ShapeGraphs, index: int, layer: torch.nn.Module, signature, links, call, run_factory,
                 needs_input_grad: bool, static_in: torch.Tensor):
        self.shape, self.index, self.call, self.run_factory = shape, index, call, run_factory
        self.signature, self.links = signature, links  # of the layer's arguments; their static copies
        self.needs_input_grad, self.static_in = needs_input_grad, static_in
        self.kept = run_factory is None  # no recompute: the forward records autograd, the backward differentiates it
        self._record: tuple | None = None  # a kept layer's captured forward: (its input, its output)
        self.offloaded = index in shape.offloaded  # its input goes to host memory between forward and backward
        # Its output goes into one of the two alternating buffers where the next layer's input is offloaded.
        self.output_in_ring = index + 1 in shape.offloaded
        # Its attention output goes to host memory too (recomputed layers whose input does: see new_plan).
        self.attention = _KeptAttention(shape, index) if index in shape.attention_offloaded and not self.kept else None
        self.autocast = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        # The trainable parameters, where each lives, and an alias of each (same memory) for the backward's capture:
        # differentiating the parameters themselves there would meet the accumulators autograd made for them on
        # the training stream, whose wait on that stream no capture can hold.
        places = {}
        for module in layer.modules():
            for name, param in module._parameters.items():
                if param is not None and param.requires_grad:
                    places.setdefault(param, []).append((module, name))
        self.params = list(places)
        self.places = list(places.values())
        self.aliases = [param.detach().requires_grad_() for param in self.params]
        # Where every weight was at the capture: a graph reads those addresses, so weights that move or are replaced
        # (sharded ones gathered anew each step, say) end the graphs. Read from the modules each time, not kept.
        self.weight_slots = [(tensors, name) for module in layer.modules()
                             for tensors in (module._parameters, module._buffers) for name in tensors]
        self.addresses = self.weight_addresses()
        self.forward_graph = torch.cuda.CUDAGraph()
        self.backward_graph: torch.cuda.CUDAGraph | None = None
        self.static_out: torch.Tensor | None = None
        self.static_grad_out: torch.Tensor | None = None
        self.static_grads: tuple = ()
        self._token = _no_token

    def weight_addresses(self) -> tuple:
        return tuple(getattr(tensors.get(name), "data_ptr", int)() for tensors, name in self.weight_slots)

    def pending(self) -> bool:
        """Whether the buffers hold a forward whose backward is still to come (its autograd node alive, its
        backward not run)."""
        return self._token() is not None

    def start(self, token: _Token) -> None:
        self._token = weakref.ref(token)

    def backward_done(self) -> None:
        self._token = _no_token

    def _forward(self):
        to_host = [(self.shape.host_copy(self.index, self.static_in), self.static_in)] if self.offloaded else []
        with self._autocast(), factor_casts_uncached(), _copying_beside(self.shape.copy_stream, to_host):
            if self.kept:
                with torch.enable_grad(), self._aliased():
                    x = self.static_in.detach().requires_grad_(self.needs_input_grad)
                    self._record = x, self.call(x)
                out = self._record[1].detach() if isinstance(self._record[1], torch.Tensor) else self._record[1]
            else:
                with torch.no_grad(), self.run_factory(attention_keep=self.attention).contexts()[0]:
                    out = self.call(self.static_in)
            if self.output_in_ring and isinstance(out, torch.Tensor):
                ring = self.shape.ring_buffer(out, self.index % 2)
                with torch.no_grad():
                    ring.copy_(out)
                out = ring
        if self.attention is not None:
            self.attention.copied()
        return out

    def _backward(self, recorded: bool = True, grad_out: torch.Tensor | None = None, bring_back_below: bool = True):
        """The input gradient (into its buffer) and the parameters' gradients of grad_out (the static one by default).
        A kept layer differentiates its forward graph's record, unless not `recorded`: then a forward made here, as a
        recomputed layer does (the warm-up: the MLP's backward writes into what the forward saved, so differentiating
        the record twice would differ from once). bring_back_below: the offloaded input of the layer below comes back
        beside it (not in the warm-up at the forward, where that buffer holds the next layer's input)."""
        grad_out = self.static_grad_out if grad_out is None else grad_out
        below = self.shape.layers.get(self.index - 1) if self.index - 1 in self.shape.offloaded else None
        back = below.copies_back() if below is not None and bring_back_below else []
        # (Autocast as in the forward: backward runs on autograd's thread, which does not carry it.)
        with self._autocast(), factor_casts_uncached(), _copying_beside(self.shape.copy_stream, back):
            if self.kept and recorded:
                x, out = self._record
                inputs = ([x] if self.needs_input_grad else []) + self.aliases
                # (retain_graph: every replay of the forward graph rewrites what this record saved, in place.)
                grads = torch.autograd.grad(out, inputs, grad_out, retain_graph=True, allow_unused=True)
            else:
                contexts = ((nullcontext(),) * 2 if self.kept
                            else self.run_factory(attention_keep=self.attention).contexts())
                with torch.enable_grad(), contexts[1], self._aliased():
                    x = self.static_in.detach().requires_grad_(self.needs_input_grad)
                    out = self.call(x)
                    inputs = ([x] if self.needs_input_grad else []) + self.aliases
                    grads = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
        if self.needs_input_grad:
            self.shape.grad_buffer(x, 1 + self.index % 2).copy_(grads[0])
            grads = grads[1:]
        return grads

    def copies_back(self) -> list:
        """[(GPU buffer, host copy)] that bring back what this layer's forward put in host memory."""
        copies = [(self.static_in, self.shape.host[self.index])] if self.offloaded else []
        return copies + (self.attention.copies_back() if self.attention is not None else [])

    def bring_back_input(self) -> None:
        """Before its backward: an offloaded input (and kept attention), unless the layer above's backward graph
        brought it back."""
        if self.shape.prefetched != self.index:
            with torch.no_grad():
                for buffer, host in self.copies_back():
                    buffer.copy_(host, non_blocking=True)
        self.shape.prefetched = None

    def brought_back(self) -> None:
        """After its backward graph: which layer's input that graph brought back."""
        self.shape.prefetched = self.index - 1 if self.index - 1 in self.shape.offloaded else None

    def _autocast(self):
        enabled, dtype = self.autocast
        return torch.autocast("cuda", dtype=dtype, enabled=enabled)

    @contextmanager
    def _aliased(self):
        for places, alias in zip(self.places, self.aliases):
            for module, name in places:
                module._parameters[name] = alias
        try:
            yield
        finally:
            for places, param in zip(self.places, self.params):
                for module, name in places:
                    module._parameters[name] = param

    def capture_forward(self) -> None:
        def check(out):
            if not isinstance(out, torch.Tensor):
                raise _NotGraphable(f"the layer returns a {type(out).__name__}")
        self.static_out = _capture(self.forward_graph, self.shape, self._forward, check, warm_up=self._forward)
        self.warm_up_backward()

    def warm_up_backward(self) -> None:
        """Once per kind of layer, before the first backward capture of that kind: one eager backward on the capture
        stream, so that Triton tunes and cuBLAS makes the workspace of autograd's thread for that stream outside any
        capture (the others of its kind then find them ready). Run here, at the layer's forward capture, where few
        layers' checkpoints are held, not before its backward capture, where all are: there its working memory (a
        layer's backward, outside the graphs' pool) set the capture step's peak. A zero gradient; what it leaves
        cached for the capture stream goes back to the device."""
        kind = (self.kept, self.signature, self.needs_input_grad, self.attention is not None)
        if kind in self.shape.warmed_backwards:
            return
        self.shape.warmed_backwards.append(kind)
        if self.attention is not None:  # (its buffer is free while the forwards run)
            with torch.no_grad():
                for buffer, host in self.attention.copies_back():
                    buffer.copy_(host)
        _warm_up(self.shape, lambda: self._backward(recorded=False, grad_out=torch.zeros_like(self.static_out),
                                                    bring_back_below=False))

    def capture_backward(self, grad_out: torch.Tensor) -> None:
        which = 1 + (self.index + 1) % 2
        above = self.shape.grad_buffers[which] if len(self.shape.grad_buffers) > which else None
        if above is not None and above.data_ptr() == grad_out.data_ptr() and above.shape == grad_out.shape:
            self.static_grad_out = above  # the layer above's graph writes it: no copy
        else:
            self.static_grad_out = self.shape.grad_buffer(grad_out, 0)
            self.static_grad_out.copy_(grad_out)
        if self.needs_input_grad:
            self.shape.grad_buffer(self.static_in, 1 + self.index % 2)
        self.bring_back_input()
        graph = torch.cuda.CUDAGraph()
        self.static_grads = _capture(graph, self.shape, self._backward)  # (warmed up at the forward's capture)
        self.backward_graph = graph
        self.brought_back()

    def replay_backward(self, grad_out: torch.Tensor):
        if self.static_grad_out.data_ptr() != grad_out.data_ptr():
            with torch.no_grad():
                self.static_grad_out.copy_(grad_out)
        self.bring_back_input()
        self.backward_graph.replay()
        self.brought_back()
        return self.input_grad(), self.static_grads

    def input_grad(self) -> torch.Tensor | None:
        return self.shape.grad_buffers[1 + self.index % 2] if self.needs_input_grad else None


def _capture(graph: torch.cuda.CUDAGraph, shape: _ShapeGraphs, fn, check=None, warm_up=None):
    """fn's result, captured into graph, and the graph replayed once. warm_up (fn or its stand-in), when given,
    runs once before (_warm_up): kernels that compile or tune, and cuBLAS's workspace for the capture's stream and
    thread, do so outside the capture."""
    # Cached blocks go back to the device first (_warm_up ends so): a capture cannot free them (no cudaFree while
    # capturing), so near the memory's end it failed for want of what the cache held (layer 0's capture under a cap
    # of 4.98 GiB with 1.09 GiB cached: docs/benchmarks.md, twenty-eighth round). Only the capture step pays the sync.
    if warm_up is not None:
        _warm_up(shape, warm_up, check)
    else:
        torch.cuda.empty_cache()
    stream = shape.stream
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=shape.pool, capture_error_mode="thread_local")
        try:
            result = fn()
        except BaseException:
            _end_failed_capture(graph)
            raise
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    shape.kept.extend(b for b in shared_buffers() + window_block_masks() if all(b is not k for k in shape.kept))
    graph.replay()
    return result


def _warm_up(shape: _ShapeGraphs, fn, check=None) -> None:
    """fn run once, eagerly, on the capture stream, its result passed to check (when given) and dropped; then the
    blocks it left cached for that stream, which no other stream's allocations can take, go back to the device."""
    stream = shape.stream  # (None: the tests' CPU stand-in)
    if stream is not None:
        stream.wait_stream(torch.cuda.current_stream())
    with nullcontext() if stream is None else torch.cuda.stream(stream):
        result = fn()
        if check is not None:
            check(result)
        del result
    if stream is not None:
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.empty_cache()


def _end_failed_capture(graph: torch.cuda.CUDAGraph) -> None:
    """Ends a capture that an operation broke. torch then skips giving the CUDA random generator back from capture
    mode (every later draw would raise "Offset increment outside graph capture"); an empty capture gives it back."""
    try:
        graph.capture_end()
    except Exception:  # noqa: BLE001 - it reports the break the caller raises anyway
        pass
    empty = torch.cuda.CUDAGraph()
    with torch.cuda.stream(torch.cuda.Stream()), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the CUDA graph is empty"
        empty.capture_begin(capture_error_mode="thread_local")
        empty.capture_end()


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, layer_graph: _LayerGraph, hidden_states, *params):
        ctx.layer_graph = layer_graph
        ctx.token = _Token()
        layer_graph.start(ctx.token)
        return layer_graph.static_out.detach()

    @staticmethod
    def backward(ctx, grad_out):
        layer_graph = ctx.layer_graph
        layer_graph.backward_done()
        if layer_graph.backward_graph is None:
            return None, *layer_graph.shape.owner.capture_backward(layer_graph, grad_out)
        dx, grads = layer_graph.replay_backward(grad_out)
        return None, dx, *grads


class LayerGraphs:
    """The memory engine's graphed layers (see the module docstring)."""

    def __init__(self):
        self.current: _ShapeGraphs | None = None
        self.candidate, self.candidate_count = None, 0
        self.drops = 0
        self.off_reason: str | None = None
        self.forward_key = None  # the key this forward's layers run graphed with (None: the ordinary path)
        self.graphed_forwards = 0  # forwards whose first layer ran from its graph (or was captured)
        self.lora_modules: dict[int, list] = {}  # by layer index
        self.offloaded: frozenset[int] = frozenset()  # the layers whose input the plan puts in host memory
        self.attention_offloaded: frozenset[int] = frozenset()  # and those whose attention output too

    def off(self, reason: str) -> None:
        if self.off_reason is None:
            self.off_reason = reason
            logger.warning("lanner.kernels: CUDA graphs of the decoder layers are off for this run: %s", reason)
        self._drop()

    def new_plan(self, offloaded=(), attention_offloaded=()) -> None:
        """The engine planned anew (a longer batch): graphs captured under the old plan's options are let go of.
        offloaded: the layers whose input the new plan puts in host memory (the first layer's stays in the graphs'
        buffer for it, which exists anyway); attention_offloaded: those of them whose attention output too."""
        self._drop()
        self.candidate, self.candidate_count = None, 0
        self.offloaded = frozenset(index for index in offloaded if index > 0)
        self.attention_offloaded = self.offloaded.intersection(attention_offloaded)

    def _drop(self) -> None:
        """Lets go of the current shape's graphs and buffers (a layer whose backward is still to come keeps its own
        until then): the shape and its layers refer to each other, which would wait for Python's collector."""
        if self.current is not None:
            self.current.layers.clear()
            self.current = None

    def _callable_from_graphs(self, forward, hidden_states: torch.Tensor, args) -> bool:
        """Graphs on, and a layer called with keyword arguments only, on the graphs' device."""
        return (self.off_reason is None and not args and isinstance(forward, functools.partial)
                and _on_graph_device(hidden_states))

    def could_run(self, forward, hidden_states: torch.Tensor, args) -> bool:
        """Whether a layer called so could run from graphs (not a padded or packed batch, say): the engine plans for
        graphs only then."""
        if not self._callable_from_graphs(forward, hidden_states, args):
            return False
        try:
            _signature(forward.keywords)
        except _NotGraphable:
            return False
        return True

    def run(self, index: int, layer: torch.nn.Module, forward, hidden_states: torch.Tensor, args, run_factory):
        """The layer's output from its graph, or None when this call takes the ordinary path. run_factory makes the
        LayerRun of a recomputed layer; None for a kept one."""
        if not self._callable_from_graphs(forward, hidden_states, args) or torch.cuda.is_current_stream_capturing():
            return None
        try:
            # The batch's shape, and this layer's arguments and state (layers may differ in them: Gemma's sliding
            # and global layers take different masks and RoPE tables; the first layer's input often needs no
            # gradient where the others' do). Graphs are made for a shape and the first layer's signature: a
            # lasting change of either (an adapter switched, say) makes them anew, as a new shape does.
            shape_key = (_described(hidden_states), torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
            signature = (_signature(forward.keywords), hidden_states.requires_grad, layer.training,
                         self._adapters_of(index, layer))
        except _NotGraphable:
            if index == 0:
                self.forward_key = None
            return None
        if index == 0:
            self._choose((shape_key, signature))
            if self.forward_key is not None:
                self.current.forwards += 1
        if self.forward_key is None or shape_key != self.forward_key[0] or self.current is None:
            return None
        shape = self.current
        layer_graph = shape.layers.get(index)
        if layer_graph is None:
            try:
                layer_graph = self._capture_forward(shape, index, layer, forward, hidden_states, signature,
                                                    run_factory)
            except Exception as error:  # noqa: BLE001 - any failure to capture means the ordinary path, said once
                self.off(f"layer {index} could not be captured ({type(error).__name__}: {error})")
                return None
            if layer_graph is None:
                return None
        elif layer_graph.pending() or not self._replay_forward(shape, layer_graph, hidden_states, forward.keywords,
                                                               signature):
            return None
        self.graphed_forwards += index == 0
        return _Replay.apply(layer_graph, hidden_states, *layer_graph.params)

    def _adapters_of(self, index: int, layer: torch.nn.Module) -> tuple:
        """The state of the layer's LoRA layers (adapters switched, disabled or merged change its forward)."""
        modules = self.lora_modules.get(index)
        if modules is None:
            modules = self.lora_modules[index] = [m for m in layer.modules() if hasattr(m, "lora_A")]
        return tuple(adapter_state(m) for m in modules)

    def _choose(self, key) -> None:
        """At the first layer: graphs for this forward's shape, made, kept, dropped or not yet."""
        self.forward_key = None
        if self.current is not None and self.current.key == key:
            self.forward_key = key
            if self.current.fresh:  # what the ordinary path's steps left cached is not needed while graphs run
                self.current.fresh = False
                torch.cuda.empty_cache()
            return
        self.candidate_count = self.candidate_count + 1 if key == self.candidate else 1
        self.candidate = key
        if self.candidate_count < _REPEATS_BEFORE_CAPTURE:
            return
        if self.current is not None:
            if self.current.pending():
                return
            self.drops += 1
            self._drop()
            torch.cuda.empty_cache()
            if self.drops >= _MAX_DROPS:
                self.off(f"the batch shape or the layers' state changed {self.drops} times (graphs stand for "
                         "batches of one shape)")
                return
        self.current = _ShapeGraphs(key, self)
        self.forward_key = key

    def _capture_forward(self, shape, index, layer, forward, hidden_states, signature, run_factory):
        owner = shape.outputs().get(hidden_states.data_ptr())
        if owner is not None and owner.static_out.shape == hidden_states.shape:
            static_in = owner.static_out  # the layer below's graph output: read in place
        elif index == 0:
            static_in = shape.first_input = hidden_states.detach().clone(memory_format=torch.contiguous_format)
        else:
            return None  # the layer below ran the ordinary path: this one too (its input has no fixed place)
        kwargs, links = shape.static_kwargs(forward.keywords)
        call = functools.partial(forward.func, *forward.args, **kwargs)
        layer_graph = _LayerGraph(shape, index, layer, signature, links, call, run_factory,
                                  hidden_states.requires_grad, static_in)
        layer_graph.capture_forward()
        shape.layers[index] = layer_graph
        if index == 0:  # (in the job's log beside the plan)
            print(f"lanner.kernels: decoder layers run from CUDA graphs for batches of shape "
                  f"{tuple(hidden_states.shape[:-1])}", flush=True)
        return layer_graph

    def _replay_forward(self, shape, layer_graph, hidden_states, kwargs, signature) -> bool:
        if signature != layer_graph.signature:
            return False
        if layer_graph.weight_addresses() != layer_graph.addresses:
            self.off(f"layer {layer_graph.index}'s weights moved since its capture (sharded or reloaded weights)")
            return False
        static_in = layer_graph.static_in
        if static_in.data_ptr() != hidden_states.data_ptr():
            if static_in is not shape.first_input:
                return False  # its input is the layer below's output, which ran the ordinary path this time
            # (Not recorded by autograd: a copy of a tensor that needs a gradient would give the buffer a history,
            # each step's linked to the last, keeping every step's input alive.)
            with torch.no_grad():
                static_in.copy_(hidden_states)
        if not _copy_in_arguments(kwargs, layer_graph.links, shape.forwards):
            self.off(f"layer {layer_graph.index} took another tensor where the layers shared one at the capture")
            return False
        layer_graph.forward_graph.replay()
        return True

    def capture_backward(self, layer_graph: _LayerGraph, grad_out: torch.Tensor):
        """(input gradient, parameter gradients) of the layer's first graphed backward, which captures its graph;
        computed without a graph when the capture fails (graphs then stay off)."""
        if self.off_reason is None:
            try:
                layer_graph.capture_backward(grad_out)  # (which replays it once)
                return layer_graph.input_grad(), *layer_graph.static_grads
            except Exception as error:  # noqa: BLE001 - as for forwards; this step's gradients still come
                self.off(f"layer {layer_graph.index}'s backward could not be captured "
                         f"({type(error).__name__}: {error})")
        layer_graph.static_grad_out = grad_out
        layer_graph.bring_back_input()
        grads = layer_graph._backward()
        layer_graph.brought_back()
        return layer_graph.input_grad(), *grads
