"""CUDA graphs of the memory engine's recomputed layers (memory/graphs.py): the same training as the ordinary path,
step for step, through shape changes, two forwards before a backward, and a layer that cannot be captured."""
import dataclasses
import os

import pytest
import torch

from lanner.kernels import get_lora_model
from lanner.kernels.attention.transformers_glue import AttentionLayout
from lanner.kernels.memory import memory_engine_of
from lanner.kernels.memory.graphs import _NotGraphable, _signature, graph_pool_free_bytes
from lanner.kernels.memory.planner import LayerPlan
from lora_twins import lora_weights, max_relative_error, randomise_lora, tiny_model, token_batches

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
# Sizes in multiples of 16: FP8 GEMMs take no others, SDPA's flash kernel (kept attention) no head dim of 12.
_SIXTEENS = dict(hidden_size=64, intermediate_size=128)


def test_a_padded_or_packed_batch_is_not_graphed():
    """The layout of a batch with padding or packed samples holds that batch's tensors: such layers run as they
    would without graphs. A whole causal sequence, and a padding mask that keeps every token, are graphed."""
    def layout(mask, position_ids=None):
        return AttentionLayout(dict(q_length=4, kv_length=4, attention_mask=mask, position_ids=position_ids))

    assert _signature(layout(None)) == _signature(layout(torch.ones(2, 4, dtype=torch.long)))
    with pytest.raises(_NotGraphable):
        _signature(layout(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])))
    with pytest.raises(_NotGraphable):
        _signature(torch.zeros(2, requires_grad=True))
    with pytest.raises(_NotGraphable):
        _signature(object())


class _GraphStandIn:
    """torch's CUDA graph on the CPU, for the bookkeeping around it: "capturing" runs the function, "replaying"
    runs it again and writes its results into the captured ones, in place, as a replay writes the same memory.
    A replay that read a stale buffer or argument gives a stale result, as a graph would."""

    replay = None


def _captured_on_the_cpu(graph, shape, fn, check=None, warm_up=None):
    if warm_up is not None:
        warmed = warm_up()
        if check is not None:
            check(warmed)
    result = fn()

    def replay():
        with torch.no_grad():
            fresh = fn()
            for kept, new in zip(*((result, fresh) if isinstance(result, tuple) else ((result,), (fresh,)))):
                if kept is not None:
                    kept.copy_(new)
    graph.replay = replay
    return result


@pytest.fixture
def graphs_device(monkeypatch):
    """"cuda" where there is one; on the CPU, "cpu" with the stand-in for torch's CUDA graphs (see _GraphStandIn)."""
    if torch.cuda.is_available():
        return "cuda"
    from lanner.kernels.memory import engine as engine_module
    from lanner.kernels.memory import graphs as graphs_module

    monkeypatch.setattr(graphs_module, "_capture", _captured_on_the_cpu)
    monkeypatch.setattr(graphs_module, "_on_graph_device", lambda tensor: True)
    monkeypatch.setattr(graphs_module, "_capture_stream", lambda: None)
    monkeypatch.setattr(engine_module, "graphs_wanted", lambda: os.environ.get("LANNER_CUDA_GRAPHS") != "0")
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _GraphStandIn)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU stand-in; the GPU tests below use real graphs")
def test_the_graphs_bookkeeping_on_the_cpu(monkeypatch, graphs_device):
    """The layer graphs' bookkeeping on the CPU, with a stand-in for torch's CUDA graph (see _GraphStandIn): a
    shape graphed and replayed, two forwards before a backward, another shape, a forward with the adapter
    disabled, a first layer whose input needs no gradient, then a replaced weight: every loss and the final weights
    as the ordinary path gives them. The GPU tests run the same cases on real graphs."""
    from lanner.kernels.memory import engine as engine_module

    a = token_batches(6, 2, 8, 96)
    b = token_batches(2, 1, 6, 96, seed=3)
    results = {}
    for graphs in (True, False):
        monkeypatch.setattr(engine_module, "graphs_wanted", lambda: graphs)
        model = get_lora_model(tiny_model("llama", num_hidden_layers=2), r=4, lora_alpha=4)
        randomise_lora(model)
        model.train()
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
        losses = []

        def step(*batches):
            loss = sum(model(input_ids=ids, labels=ids).loss for ids in batches)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())

        step(a[0]), step(a[1]), step(a[2]), step(a[3], a[4])  # planned, captured, replayed, two forwards
        with model.disable_adapter():
            losses.append(model(input_ids=a[5], labels=a[5]).loss.item())
        step(a[5]), step(b[0]), step(b[1])  # replayed again, then another shape twice (graphs remade)
        model.get_input_embeddings()._forward_hooks.clear()  # (the hooks that make its output need a gradient)
        step(b[0]), step(b[1])  # the first layer's input needs no gradient now: graphs remade
        factor = model.get_base_model().model.layers[1].self_attn.q_proj.lora_B["default"]
        factor.weight = torch.nn.Parameter(factor.weight.detach() * 2)
        step(b[0])
        results[graphs] = losses, lora_weights(model), memory_engine_of(model).graphs
    (losses, weights, graphs), (plain_losses, plain_weights, plain) = results[True], results[False]
    assert plain is None and graphs.graphed_forwards == 7 and graphs.drops == 2
    assert graphs.off_reason.startswith("layer 1's weights moved")
    torch.testing.assert_close(losses, plain_losses, rtol=1e-5, atol=0)
    assert max_relative_error(weights, plain_weights) < 1e-5


def _trained(family, batches, monkeypatch, graphs: bool, two_forwards_at=(), hook=None, layers=3, fp8=False,
             sizes=None):
    """Losses, final LoRA weights, the memory engine and the bytes allocated as each step starts, of SGD steps on
    `batches` (float32, on the batches' device); at the steps in two_forwards_at, two forwards (this batch and the
    next) before one backward. fp8: over FP8 base weights (whose layers run patching/layers.py's forward). sizes: the
    model's hidden and intermediate sizes, when not the tiny ones (FP8's multiples of 16 for FP8)."""
    monkeypatch.setenv("LANNER_CUDA_GRAPHS", "1" if graphs else "0")
    layer_types = dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"]) \
        if family == "gemma3" else {}
    device = batches[0].device
    sizes = sizes or (_SIXTEENS if fp8 else {})
    model = get_lora_model(tiny_model(family, device=device, num_hidden_layers=layers, **layer_types, **sizes),
                           r=8, lora_alpha=8, load_in_fp8=fp8)
    randomise_lora(model)
    model.train()
    if hook is not None:
        hook(model)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    losses, i = [], 0
    held = []  # bytes allocated as each step starts
    while i < len(batches):
        held.append(torch.cuda.memory_allocated() if device.type == "cuda" else 0)
        extra = 1 if i in two_forwards_at else 0
        loss = sum(model(input_ids=ids, labels=ids).loss for ids in batches[i:i + 1 + extra])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        i += 1 + extra
    return losses, lora_weights(model), memory_engine_of(model), held


@gpu
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_graphed_layers_train_as_the_ordinary_path(family, monkeypatch):
    """Six steps: the first two ordinary (planning, then the shape's second sight captures), the rest replayed.
    Gemma 3: sliding and global layers, each with its own mask and RoPE tables."""
    batches = token_batches(6, 2, 24, 96, device="cuda")
    losses, weights, engine, held = _trained(family, batches, monkeypatch, graphs=True)
    assert graph_pool_free_bytes() > 0  # the layers' working memory, in their pool (which the allocated bytes miss)
    plain_losses, plain_weights, _, _ = _trained(family, batches, monkeypatch, graphs=False)
    graphs = engine.graphs
    assert graphs.off_reason is None and graphs.current is not None
    assert sorted(graphs.current.layers) == [0, 1, 2]
    assert all(layer.backward_graph is not None for layer in graphs.current.layers.values())
    assert graphs.graphed_forwards == 5  # every step from the capture on (a loss kept alive does not hold them back)
    assert len(set(held[2:])) == 1  # replayed steps leave nothing behind
    torch.testing.assert_close(losses, plain_losses, rtol=1e-5, atol=0)
    assert max_relative_error(weights, plain_weights) < 1e-5


@gpu
def test_shape_changes_and_two_forwards_before_a_backward(monkeypatch):
    """A shape graphed, then two forwards of it before one backward (the second runs the ordinary path), then
    another shape twice (the first shape's graphs dropped, the new one's made), then the first again (ordinary
    until it repeats): every step as without graphs."""
    a = token_batches(6, 2, 24, 96, device="cuda")
    b = token_batches(3, 1, 16, 96, seed=3, device="cuda")
    batches = [a[0], a[1], a[2], a[3], a[4], b[0], b[1], b[2], a[5]]
    losses, weights, engine, _ = _trained("llama", batches, monkeypatch, graphs=True, two_forwards_at=(3,))
    plain_losses, plain_weights, _, _ = _trained("llama", batches, monkeypatch, graphs=False, two_forwards_at=(3,))
    torch.testing.assert_close(losses, plain_losses, rtol=1e-5, atol=0)
    assert max_relative_error(weights, plain_weights) < 1e-5
    graphs = engine.graphs
    assert graphs.off_reason is None and graphs.drops == 1
    assert graphs.current.key[0][0][1] == (1, 16, 48)  # the second shape's graphs are the ones kept


@gpu
def test_a_layer_that_cannot_be_captured_turns_graphs_off_and_trains_on(monkeypatch, caplog):
    """A layer that reads a value back to the host (no graph can hold that): the capture fails at that layer,
    graphs go off with one log line, and the steps (the layers below it captured already among them) train as
    without graphs. The CUDA random generator, which a broken capture leaves in capture mode, draws again."""
    def sync_in_layer_1(model):
        mlp = model.get_base_model().model.layers[1].mlp
        mlp.register_forward_pre_hook(lambda module, args: (args[0].sum().item(), None)[1])

    batches = token_batches(4, 2, 24, 96, device="cuda")
    losses, weights, engine, _ = _trained("llama", batches, monkeypatch, graphs=True, hook=sync_in_layer_1)
    plain_losses, plain_weights, _, _ = _trained("llama", batches, monkeypatch, graphs=False, hook=sync_in_layer_1)
    assert engine.graphs.off_reason.startswith("layer 1 could not be captured")
    assert "CUDA graphs of the decoder layers are off" in caplog.text
    torch.testing.assert_close(losses, plain_losses, rtol=1e-5, atol=0)
    assert max_relative_error(weights, plain_weights) < 1e-5
    torch.randint(0, 9, (4,), device="cuda")


@gpu
def test_a_forward_with_the_adapter_disabled_is_not_replayed_from_the_adapted_graphs(monkeypatch):
    """PEFT's disable_adapter with gradients on (a reference pass some trainers take with grad): the graphs were
    captured with the adapter on, so that forward takes the ordinary path and gives the base model's loss."""
    batches = token_batches(4, 2, 24, 96, device="cuda")
    losses = {}
    for graphs in (True, False):
        monkeypatch.setenv("LANNER_CUDA_GRAPHS", "1" if graphs else "0")
        model = get_lora_model(tiny_model("llama", device="cuda", num_hidden_layers=3), r=8, lora_alpha=8)
        randomise_lora(model)
        model.train()
        for ids in batches[:3]:  # planned, captured, replayed
            model(input_ids=ids, labels=ids).loss.backward()
        with model.disable_adapter():
            losses[graphs] = [model(input_ids=batches[3], labels=batches[3]).loss.item()]
        losses[graphs].append(model(input_ids=batches[3], labels=batches[3]).loss.item())
    assert losses[True][0] != losses[True][1]  # the adapter matters to the loss
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=0)


@gpu
def test_a_replaced_weight_ends_the_graphs(monkeypatch):
    """A graph reads its weights where they were at the capture: a weight replaced afterwards (as sharded weights
    gathered anew would be) turns graphs off at that layer, and the loss is the new weight's."""
    batches = token_batches(4, 2, 24, 96, device="cuda")
    losses, engines = {}, {}
    for graphs in (True, False):
        monkeypatch.setenv("LANNER_CUDA_GRAPHS", "1" if graphs else "0")
        model = get_lora_model(tiny_model("llama", device="cuda", num_hidden_layers=3), r=8, lora_alpha=8)
        randomise_lora(model)
        model.train()
        for ids in batches[:3]:
            model(input_ids=ids, labels=ids).loss.backward()
        factor = model.get_base_model().model.layers[1].self_attn.q_proj.lora_B["default"]
        factor.weight = torch.nn.Parameter(factor.weight.detach() * 2)
        losses[graphs] = model(input_ids=batches[3], labels=batches[3]).loss.item()
        engines[graphs] = memory_engine_of(model)
    assert engines[True].graphs.off_reason.startswith("layer 1's weights moved")
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=0)


@gpu
def test_graphed_layers_under_autocast_train_as_the_ordinary_path(monkeypatch):
    """A float32 model under bf16 autocast (a trainer's mixed precision): the backward's graph recomputes under the
    forward's autocast, as torch's checkpoint does, though autograd's thread does not carry it."""
    batches = token_batches(5, 2, 24, 96, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        losses, weights, engine, _ = _trained("llama", batches, monkeypatch, graphs=True)
        plain_losses, plain_weights, _, _ = _trained("llama", batches, monkeypatch, graphs=False)
    assert engine.graphs.graphed_forwards == 4
    torch.testing.assert_close(losses, plain_losses, rtol=1e-3, atol=0)
    assert max_relative_error(weights, plain_weights) < 1e-2


@gpu
def test_a_first_layer_whose_input_needs_no_gradient(monkeypatch):
    """Without PEFT's input-gradient hook the embeddings' output needs no gradient: the first layer's graph computes
    no input gradient, and the layers above (whose inputs do need one) are graphed all the same."""
    def frozen_input(model):
        model.get_input_embeddings()._forward_hooks.clear()  # (the hooks that make its output need a gradient)

    batches = token_batches(4, 2, 24, 96, device="cuda")
    losses, weights, engine, _ = _trained("llama", batches, monkeypatch, graphs=True, hook=frozen_input)
    plain_losses, plain_weights, _, _ = _trained("llama", batches, monkeypatch, graphs=False, hook=frozen_input)
    layers = engine.graphs.current.layers
    assert sorted(layers) == [0, 1, 2] and not layers[0].needs_input_grad and layers[1].needs_input_grad
    torch.testing.assert_close(losses, plain_losses, rtol=1e-5, atol=0)
    assert max_relative_error(weights, plain_weights) < 1e-5


@pytest.mark.parametrize("fp8", [False, True], ids=["16-bit", "fp8"])
def test_offloaded_inputs_and_kept_layers_run_graphed_as_the_ordinary_path(fp8, monkeypatch, graphs_device):
    """A plan of five layers, R Roa Ro K Roa (o: input in host memory, a: attention output too; the planner never
    offloads the last layer's, graphs take it all the same): inputs go out from their layer's forward graph and come
    back in the backward graph of the layer above (a kept one's too), or in their own where none did; outputs
    alternate in two buffers; attention outputs go and come back with their inputs, and the recomputes take them
    instead of running the attention forward; kept layers' graphs record autograd and differentiate it. Every loss
    and the final weights as the same plan gives them without graphs (the layers on patching/layers.py's forward,
    its norms passing their inputs on), over FP8 bases too (their o and down terms in the residual adds). On the GPU
    the 16-bit model trains under bf16 autocast: SDPA's fused kernels, which the kept attention calls, take no
    float32 (an FP8 model's float32 attention keeps nothing there)."""
    from lanner.kernels.attention import kept_sdpa
    from lanner.kernels.memory import engine as engine_module

    from lanner.kernels.patching import layers as layers_module

    codes = ["R", "Roa", "Ro", "K", "Roa"]
    layers = tuple(LayerPlan("keep" if code == "K" else "recompute", "o" in code, offload_attention="a" in code)
                   for code in codes)
    planned = engine_module.plan_memory
    monkeypatch.setattr(engine_module, "plan_memory",
                        lambda *args, **kwargs: dataclasses.replace(planned(*args, **kwargs), layers=layers))
    unread = []  # the recomputes differentiate the layers' output without making their last residual add
    unread_sum = layers_module.unread_sum
    monkeypatch.setattr(layers_module, "unread_sum", lambda *args: unread.append(1) or unread_sum(*args))
    attention_forwards = []  # per step, the attention forwards on the path that keeps their output
    fused_forward = kept_sdpa._forward
    monkeypatch.setattr(kept_sdpa, "_forward", lambda *args: attention_forwards.append(1) or fused_forward(*args))
    step_starts = []

    def count_steps(model):
        model.register_forward_pre_hook(lambda *args: step_starts.append(len(attention_forwards)))

    batches = token_batches(4, 1, 8, 96, device=graphs_device)
    on_gpu = graphs_device == "cuda"
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu and not fp8):
        losses, weights, engine, held = _trained("llama", batches, monkeypatch, graphs=True, layers=len(codes),
                                                 fp8=fp8, hook=count_steps, sizes=_SIXTEENS)
        last_step_attention_forwards = len(attention_forwards) - step_starts[-1]
        plain_losses, plain_weights, plain, _ = _trained("llama", batches, monkeypatch, graphs=False,
                                                         layers=len(codes), fp8=fp8, sizes=_SIXTEENS)
    assert unread
    if not on_gpu:  # (a real graph's replays run no Python) the two layers' forwards only, no recompute
        assert last_step_attention_forwards == 2
    assert plain.graphs is None and [layer.code for layer in plain.plan.layers] == codes
    graphs = engine.graphs
    assert engine.plan.graphed and graphs.off_reason is None and graphs.graphed_forwards == 3
    shape = graphs.current
    assert sorted(shape.layers) == list(range(len(codes))) and sorted(shape.host) == [1, 2, 4]
    assert [i for i, layer in shape.layers.items() if layer.attention is not None] == [1, 4]
    if not (on_gpu and fp8):
        assert len(shape.attention_ring) == 2 and all(shape.layers[i].attention.host for i in (1, 4))
        # (the buffers are no recompute's output: an autograd history on them would hold a layer's saved tensors)
        assert not any(t.requires_grad for buffers in shape.attention_ring for t in buffers)
    assert [layer.kept for layer in shape.layers.values()] == [code == "K" for code in codes]
    assert len(shape.ring) == 2 and held[2] == held[3]
    tolerance = 1e-3 if on_gpu and not fp8 else 1e-5  # (bf16 autocast: as test_graphed_layers_under_autocast...)
    torch.testing.assert_close(losses, plain_losses, rtol=tolerance, atol=0)
    assert max_relative_error(weights, plain_weights) < 10 * tolerance


def test_the_engine_plans_for_graphs_only_where_the_batch_could_be_graphed(monkeypatch, graphs_device):
    """A padded first batch gets the ordinary plan (which may keep MLPs and put up projections in host memory,
    what graphs cannot hold); a whole causal batch, a plan for graphs."""
    monkeypatch.setenv("LANNER_CUDA_GRAPHS", "1")
    graphed = {}
    for padded in (True, False):
        model = get_lora_model(tiny_model("llama", device=graphs_device, num_hidden_layers=2), r=4, lora_alpha=4)
        model.train()
        ids = token_batches(1, 2, 8, 96, device=graphs_device)[0]
        mask = torch.ones_like(ids)
        mask[0, -3:] = 0 if padded else 1
        model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        graphed[padded] = memory_engine_of(model).plan.graphed
    assert graphed == {True: False, False: True}


def test_each_kind_of_layer_warms_its_backward_up_at_its_forward_capture(monkeypatch, graphs_device):
    """The eager backward that tunes a kind of layer's kernels before its first backward capture runs at the layer's
    forward capture, when few checkpoints are held (before the first backward it came on top of all of them and set
    the capture step's peak); the captured step and the next train as the ordinary path does."""
    batches = token_batches(3, 1, 8, 96, device=graphs_device)
    warmed_before_backward = []  # at the end of the capture step's forward: every kind of layer warmed up

    def check_the_capture_steps_forward(model):
        forward, graphs = model.forward, memory_engine_of(model).graphs

        def forward_then_check(*args, **kwargs):
            out = forward(*args, **kwargs)
            shape = graphs.current
            if shape is not None and shape.layers and not any(layer.backward_graph for layer in shape.layers.values()):
                kinds = {(layer.kept, layer.signature, layer.needs_input_grad, layer.attention is not None)
                         for layer in shape.layers.values()}
                warmed_before_backward.append(set(shape.warmed_backwards) == kinds)
            return out
        model.forward = forward_then_check

    losses, weights, engine, _ = _trained("llama", batches, monkeypatch, graphs=True,
                                          hook=check_the_capture_steps_forward)
    plain_losses, plain_weights, _, _ = _trained("llama", batches, monkeypatch, graphs=False)
    assert engine.graphs.graphed_forwards == 2 and warmed_before_backward == [True]
    torch.testing.assert_close(losses, plain_losses, rtol=1e-5, atol=0)
    assert max_relative_error(weights, plain_weights) < 1e-5
