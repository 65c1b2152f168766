"""How much device memory a training job needs, estimated from its spec and the model's shape.

Deliberately simple (refine it against measured peaks on the GPU box):
- weights: parameters × bytes of the dtype (float32 4, bfloat16/float16 2); QLoRA stores the
  decoder's linear weights in NF4 (0.5 byte + one float32 absmax per 64 weights) and keeps the
  embeddings, lm_head and norms in 16 bits; lora_fp8 stores them in FP8 (1 byte a weight, a float32
  scale per output row) plus one shared buffer for the transposed FP8 copy of the largest weights one
  backward GEMM multiplies (gate and up stacked), filled just before it runs (docs/fp8.md); a mixture of experts' routers stay in 16 bits
  under both, its routed experts too under FP8, and under QLoRA where lanner.kernels has no grouped kernels
  for the family (elsewhere NF4, plus one layer's dequantised experts as a buffer);
- LoRA: r × (in + out) per targeted projection per layer, trained in float32;
- trainable parameters (the LoRA ones, or all for a full fine-tune) carry a gradient of their own
  dtype and Adam's two float32 moments (8 bytes);
- activations per token per decoder layer: the tensors a Llama-style layer keeps for its backward
  (6 × hidden + 2 × kv + 3 × intermediate values; 2 × intermediate on lanner.kernels, whose fused
  GLU recomputes its product), at the activations' width; no attention scores (SDPA/flash attention
  does not store them); with gradient checkpointing only each layer's input (hidden × activation
  bytes) is kept, plus one layer's activations while it is recomputed (on the H200 the 8B shape
  keeps 0.857 GiB a layer at 8,192 tokens on the kernels: this counts 0.844);
- logits: the model's 16-bit logits, transformers' float32 upcast for the loss, and both their
  gradients (tokens × vocab × (2 + 4 + 4 + 2) bytes), which lanner.kernels' fused linear +
  cross-entropy avoids (then one chunk, counted as the overhead); on the CPU, where the kernels do not
  run, CPU_LOGITS_BYTES a token and vocabulary entry (measured);
- lanner.kernels' memory engine (lora/qlora/lora_fp8 on the kernels on a GPU, docs/memory-engine.md): with
  `offload_checkpoints` the layer inputs wait in host memory (two on the GPU while they come back);
  with `memory_budget_gib` the engine keeps activations while the whole step fits the budget, so the
  activations fill the budget's room above the rest, between the smallest plan and every layer's; a
  GPU job that sets no budget gets `default_budget_bytes` of the GPU it will run on (all of its
  memory but the CUDA context is free for the job, which has the GPU to itself), which on a large
  GPU keeps every layer;
- GRPO (method grpo): generation samples batch_size × gradient_accumulation completions at once (TRL's
  generation batch, one per optimizer step) with a KV cache of max_seq_len tokens each (prompt and
  completion), and the last token's logits; it runs between training steps, so the peak holds the larger
  of generation and the step's activations + logits (generation_bytes, counted that way in the total);
- reward models a GRPO job scores with (`reward_models`, their base's shapes) are loaded for the whole
  run in the job's dtype, without gradients: each its weights (a one-output head instead of lm_head)
  plus one layer's working tensors for a scoring forward of REWARD_SCORING_BATCH rows of max_seq_len
  tokens (reward_models_bytes);
- overhead: 5% of the rest plus, on a GPU, a fixed 512 MiB (CUDA context, allocator slack); on the
  CPU, the training process's own resident memory before its model (CPU_RUNTIME_BYTES). So each
  estimate counts what its device's measured peak counts: on a GPU, the memory in use on the GPU
  (NVML); on the CPU, the resident memory (RSS) of the job's processes, which holds the Python
  runtime and its libraries as well as the tensors.
"""
from __future__ import annotations

from typing import Any

from lanner.core.spec import (MEMORY_ENGINE_METHODS, REWARD_MODEL_METHODS, JobSpec, fp8_base, quantized_base,
                              trains_adapter)

PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
NF4_BYTES_PER_WEIGHT = 0.5 + 4 / 64
FP8_BYTES_PER_WEIGHT, FP8_SCALE_BYTES = 1, 4
ADAM_BYTES = 8
CUDA_OVERHEAD_BYTES = 512 * 2**20
# A CPU training process's resident memory before its model: Python with PyTorch, transformers, TRL, PEFT and
# datasets imported (557 MiB), the tokenizer (48 MiB), the database and Redis clients (measured on the 2-core
# machine, torch 2.13 CPU, transformers 5.24; docs/benchmarks.md "Memory estimate against measured peaks").
CPU_RUNTIME_BYTES = 640 * 2**20
# What a CPU step holds per token and vocabulary entry, measured there (SmolLM2 in float32 under TRL's SFT,
# 1,024 tokens a step: the peak is 1.9 GiB over the rest): the float32 logits, the loss's log-softmax, the
# copies TRL makes for its entropy and accuracy metrics, their gradients, and what the allocator keeps of them.
CPU_LOGITS_BYTES = 40
# A job on a GPU that sets no memory budget plans for what it holds plus this share of what is free
# (its lease gives it the device alone; the rest is the allocator's and CUDA's headroom), so layers
# are kept rather than recomputed wherever the memory allows (docs/memory-engine.md).
DEFAULT_BUDGET_SHARE_OF_FREE = 0.9
# MoE model types whose checkpoints name the experts' gate and up gate_proj and up_proj: PEFT gives their fused
# gate_up adapter rank r for each of the two a job targets.
SPLIT_GATE_UP_MODEL_TYPES = ("qwen2_moe", "qwen3_moe")
# MoE model types whose routed experts QLoRA stores in NF4: lanner.kernels' mixture-of-experts families (its
# patching.moe.nf4_expert_stacks; tests/core/test_memory_estimate.py holds the two lists equal). Others keep them
# in 16 bits.
NF4_EXPERT_MODEL_TYPES = ("qwen3_moe", "mixtral", "gpt_oss")
# Completions a GRPO job's reward model scores in one forward (worker/training/reward_scoring.py).
REWARD_SCORING_BATCH = 8


def default_budget_bytes(allocated_bytes: int, free_bytes: int, memory_limit_mb: int | None) -> int:
    """The memory engine's budget for a GPU job that sets none: what it holds once its model is
    loaded, plus most of the free memory, within its memory_limit_mb cap when it has one."""
    extra = free_bytes * DEFAULT_BUDGET_SHARE_OF_FREE
    if memory_limit_mb:
        extra = min(extra, memory_limit_mb * 2**20)
    return int(allocated_bytes + extra)


# What _shape reads from a config that has no default: a config without one of them (another kind of model, e.g.
# Falcon's ffn_hidden_size) or with a value that is not a positive whole number cannot be counted.
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size")
# Read when present, with a default when absent or null.
OPTIONAL_SHAPE_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim", "num_experts", "num_local_experts",
                       "moe_intermediate_size", "num_experts_per_tok", "experts_per_token", "decoder_sparse_step")


def countable_shape(model) -> bool:
    """Whether count_parameters (and so estimate_memory) can read this config."""
    def whole(value) -> bool:
        return type(value) is int and 0 < value < 2**40

    return (isinstance(model, dict) and all(whole(model.get(key)) for key in SHAPE_KEYS)
            and all(model.get(key) is None or whole(model[key]) for key in OPTIONAL_SHAPE_KEYS)
            and all(type(layer) is int for layer in model.get("mlp_only_layers") or ()))


def _shape(model: dict[str, Any]) -> dict[str, int]:
    hidden = int(model["hidden_size"])
    heads = int(model.get("num_attention_heads") or 1)
    head_dim = int(model.get("head_dim") or hidden // heads)
    kv = int(model.get("num_key_value_heads") or heads) * head_dim
    layers = int(model["num_hidden_layers"])
    # A mixture of experts (Qwen3-MoE: num_experts, moe_intermediate_size; Mixtral and gpt-oss: num_local_experts,
    # intermediate_size): its sparse layers route each token to top_k of `experts` MLPs; Qwen3-MoE's
    # mlp_only_layers and decoder_sparse_step keep some layers dense.
    experts = int(model.get("num_experts") or model.get("num_local_experts") or 0)
    dense_only = set(model.get("mlp_only_layers") or ())
    sparse_step = int(model.get("decoder_sparse_step") or 1)
    sparse_layers = 0 if not experts else sum(
        1 for layer in range(layers) if layer not in dense_only and (layer + 1) % sparse_step == 0)
    return {"hidden": hidden, "q": heads * head_dim, "kv": kv, "intermediate": int(model["intermediate_size"]),
            "layers": layers, "vocab": int(model["vocab_size"]), "tied": bool(model.get("tie_word_embeddings", False)),
            "experts": experts, "sparse_layers": sparse_layers,
            "expert_intermediate": int(model.get("moe_intermediate_size") or model["intermediate_size"]),
            "top_k": int(model.get("num_experts_per_tok") or model.get("experts_per_token") or 1) if experts else 0}


def _attention_projections(s: dict[str, int]) -> dict[str, tuple[int, int]]:
    h = s["hidden"]
    return {"q_proj": (h, s["q"]), "k_proj": (h, s["kv"]), "v_proj": (h, s["kv"]), "o_proj": (s["q"], h)}


def _mlp_projections(s: dict[str, int], intermediate: int) -> dict[str, tuple[int, int]]:
    h = s["hidden"]
    return {"gate_proj": (h, intermediate), "up_proj": (h, intermediate), "down_proj": (intermediate, h)}


def count_parameters(model: dict[str, Any]) -> dict[str, int]:
    """Parameters of a Llama-style causal LM from its config: in the decoder's linear layers (a sparse
    layer's experts and router included), and elsewhere (embeddings, lm_head, norms)."""
    s = _shape(model)
    dense = s["layers"] - s["sparse_layers"]
    expert = sum(i * o for i, o in _mlp_projections(s, s["expert_intermediate"]).values())
    linear = (s["layers"] * sum(i * o for i, o in _attention_projections(s).values())
              + dense * sum(i * o for i, o in _mlp_projections(s, s["intermediate"]).values())
              + s["sparse_layers"] * s["experts"] * (expert + s["hidden"]))  # the router: hidden -> experts
    embeddings = s["vocab"] * s["hidden"] * (1 if s["tied"] else 2)
    norms = (2 * s["layers"] + 1) * s["hidden"]
    # Of linear: the routed experts' stacked weights, and the routers (parameters, not nn.Linear layers:
    # never quantised).
    return {"total": linear + embeddings + norms, "linear": linear, "other": embeddings + norms,
            "experts": s["sparse_layers"] * s["experts"] * expert, "routers": s["sparse_layers"] * s["experts"] * s["hidden"]}


def fp8_linear_bytes(model: dict[str, Any]) -> int:
    """The decoder's linear weights in FP8, a mixture of experts' routed experts and routers left out (they
    stay in 16 bits): 1 byte a weight, a float32 scale per output row, and the one transposed copy of the
    largest weights that backward multiplies together (gate and up stacked), filled before each GEMM."""
    s = _shape(model)
    dense_layers = s["layers"] - s["sparse_layers"]
    a = _attention_projections(s)
    m = _mlp_projections(s, s["intermediate"]) if dense_layers else {}
    attention, mlp = list(a.values()), list(m.values())

    def fp8(projections):
        return sum(i * o * FP8_BYTES_PER_WEIGHT + o * FP8_SCALE_BYTES for i, o in projections)

    # backward's one product over q/k/v, and over gate/up, transposes their stacked codes together
    groups = [[a["q_proj"], a["k_proj"], a["v_proj"]], [a["o_proj"]]]
    groups += [[m["gate_proj"], m["up_proj"]], [m["down_proj"]]] if m else []
    largest = max(sum(i * o for i, o in group) for group in groups)
    return s["layers"] * fp8(attention) + dense_layers * fp8(mlp) + largest * FP8_BYTES_PER_WEIGHT


def lora_parameters(model: dict[str, Any], r: int, target_modules: list[str] | str = "all-linear") -> int:
    s = _shape(model)

    def wanted(name: str) -> bool:
        return target_modules == "all-linear" or name in target_modules

    def adapters(projections: dict[str, tuple[int, int]]) -> int:
        return sum(r * (i + o) for name, (i, o) in projections.items() if wanted(name))

    # PEFT moves gate_proj/up_proj/down_proj of the SPLIT_GATE_UP_MODEL_TYPES onto the experts' weights: the
    # dense layers such a model has (mlp_only_layers) get no MLP adapter.
    split_names = bool(s["sparse_layers"]) and model.get("model_type") in SPLIT_GATE_UP_MODEL_TYPES
    total = (s["layers"] * adapters(_attention_projections(s))
             + (0 if split_names else s["layers"] - s["sparse_layers"]) * adapters(_mlp_projections(s, s["intermediate"])))
    if s["sparse_layers"]:
        # PEFT adapts the experts' stacked weights (target_parameters, one factor pair per expert). Gate and up
        # are one fused weight: where the checkpoint names them gate_proj and up_proj (PEFT's
        # transformers_weight_conversion), its adapter has rank r for each of the two targeted, else rank r.
        h, i, e = s["hidden"], s["expert_intermediate"], s["experts"]
        targeted = sum(wanted(name) for name in ("gate_proj", "up_proj"))
        gate_up_rank = r * (targeted if split_names else min(targeted, 1))
        total += s["sparse_layers"] * e * (gate_up_rank * (h + 2 * i) + (r * (i + h) if wanted("down_proj") else 0))
    return total


def reward_model_bytes(model: dict[str, Any], weight_bytes: int, max_seq_len: int) -> int:
    """A reward model loaded to score a GRPO job's completions: its weights (a sequence classifier, whose
    one-output score head replaces the language-model head) and one layer's working tensors for a forward
    of REWARD_SCORING_BATCH rows without gradients. Its parameter count alone when its shape is unknown."""
    if "hidden_size" not in model:
        return int(model["parameters"]) * weight_bytes
    s = _shape(model)
    parameters = count_parameters(model)["total"] - (0 if s["tied"] else s["vocab"] * s["hidden"]) + s["hidden"]
    tokens = REWARD_SCORING_BATCH * max_seq_len
    working = (4 * s["hidden"] + 2 * s["kv"] + 2 * s["intermediate"]) * weight_bytes * tokens
    return parameters * weight_bytes + working


def _memory_engine_on(spec: JobSpec, device_kind: str) -> bool:
    """lanner.kernels' memory engine plans the checkpointing of adapter jobs on the kernels on a GPU."""
    hp = spec.hyperparameters
    return (device_kind == "cuda" and spec.method in MEMORY_ENGINE_METHODS and trains_adapter(spec) and hp.use_kernels
            and hp.gradient_checkpointing)


def estimate_memory(spec: JobSpec, model: dict[str, Any], device_kind: str = "cuda",
                    device_free_bytes: int | None = None, longest_row: int | None = None,
                    reward_models: list[dict[str, Any]] = ()) -> dict[str, int]:
    """Bytes a job of this spec needs. model: the model's config.json as a dict (hidden_size,
    intermediate_size, num_hidden_layers, vocab_size, num_attention_heads, num_key_value_heads,
    head_dim, tie_word_embeddings) or {"parameters": N} when only the count is known (then
    activations are not estimated). device_free_bytes: what is free for the job on the GPU it will
    run on (its memory; the CUDA context is taken off here), for the memory engine's default budget
    (unknown: the smallest plan is assumed). A method that trains every weight (full, pretrain, a preference
    method without LoRA settings) is estimated as a full fine-tune. longest_row: the dataset's longest row in
    tokens, when measured: a batch is padded to its longest row, so without packing a step holds
    batch_size × min(longest_row, max_seq_len) tokens (max_seq_len when unknown). reward_models: the shapes (as `model`) of the reward models a GRPO job
    scores with. Returns the parts and "total_bytes", and "experts" when the shape is known."""
    hp = spec.hyperparameters
    weight_bytes = PRECISION_BYTES.get(hp.precision, 2 if device_kind == "cuda" else 4)
    act_bytes = weight_bytes
    if "hidden_size" not in model:
        total = int(model["parameters"])
        parts = {"total": total, "linear": total, "other": 0, "experts": 0, "routers": 0}
    else:
        parts = count_parameters(model)
    unquantised = parts["other"] + parts["experts"] + parts["routers"]  # in 16 bits under a quantised base too
    if quantized_base(spec):
        # NF4 experts: stored like the linear layers, and read through one dequantised buffer per projection,
        # one layer's worth (in the activations' dtype).
        experts = parts["experts"] if model.get("model_type") in NF4_EXPERT_MODEL_TYPES else 0
        buffer = experts // _shape(model)["sparse_layers"] * act_bytes if experts else 0
        weights = int((parts["linear"] - parts["experts"] - parts["routers"] + experts) * NF4_BYTES_PER_WEIGHT
                      + (unquantised - experts) * 2 + buffer)
    elif fp8_base(spec):
        linear = fp8_linear_bytes(model) if "hidden_size" in model else parts["linear"] * FP8_BYTES_PER_WEIGHT
        weights = int(linear + unquantised * 2)
    else:
        weights = parts["total"] * weight_bytes

    if not trains_adapter(spec):
        trainable, trainable_bytes = parts["total"], weight_bytes
        lora = 0
    else:
        lora = lora_parameters(model, spec.lora.rank, spec.lora.target_modules) if "hidden_size" in model else 0
        trainable, trainable_bytes = lora, 4
    adapter = lora * 4
    gradients = trainable * trainable_bytes
    optimizer = trainable * ADAM_BYTES

    activations = logits = generation = 0
    experts = {}  # a known shape's routed experts per MoE layer (0: dense), which the form's LoRA targets choice reads
    if "hidden_size" in model:
        s = _shape(model)
        experts["experts"] = s["experts"]
        row = hp.max_seq_len if hp.packing or not longest_row else min(longest_row, hp.max_seq_len)
        # A reward model's step scores both answers of each pair, and has a one-number head, no logits.
        scorer = spec.method in REWARD_MODEL_METHODS
        tokens = hp.batch_size * row * (2 if scorer else 1)
        # What a decoder layer keeps per token for its backward: its input and the norms' outputs, q/k/v,
        # the attention output, the post-attention input and norm, gate and up; plain PyTorch also keeps
        # the GLU's product for the down projection, which lanner.kernels' fused GLU recomputes.
        kernels = hp.use_kernels and device_kind == "cuda" and not scorer  # they patch causal LMs only
        # A sparse layer keeps its top_k experts' gate and up for each token, and the router's logits.
        attention = 6 * s["hidden"] + 2 * s["kv"]
        glu = 2 if kernels else 3
        dense_layer = (attention + glu * s["intermediate"]) * act_bytes * tokens
        sparse_layer = (attention + glu * s["top_k"] * s["expert_intermediate"] + s["experts"]) * act_bytes * tokens
        per_layer = max(dense_layer if s["layers"] > s["sparse_layers"] else 0, sparse_layer if s["sparse_layers"] else 0)
        every_layer = (s["layers"] - s["sparse_layers"]) * dense_layer + s["sparse_layers"] * sparse_layer
        layer_input = s["hidden"] * act_bytes * tokens
        if hp.gradient_checkpointing:
            activations = s["layers"] * layer_input + per_layer
        else:
            activations = every_layer
        if not kernels and not scorer:
            logits = tokens * s["vocab"] * (CPU_LOGITS_BYTES if device_kind == "cpu" else 2 + 4 + 4 + 2)
        budget = None if hp.memory_budget_gib is None else int(float(hp.memory_budget_gib) * 2**30)
        if budget is None and device_free_bytes is not None and _memory_engine_on(spec, device_kind):
            loaded = weights + adapter  # what the job holds when the engine picks its budget
            budget = default_budget_bytes(loaded, max(device_free_bytes - loaded - CUDA_OVERHEAD_BYTES, 0),
                                          hp.memory_limit_mb)
        if _memory_engine_on(spec, device_kind) and (budget is not None or hp.offload_checkpoints):
            # Offloaded, the layer inputs wait in host memory (two on the GPU while they come back); the
            # engine offloads when asked to, or when a budget needs it.
            activations = 2 * layer_input + per_layer
            if budget is not None:
                # The budget counts everything allocated: the engine keeps activations in the room the rest
                # leaves, at most every layer's, never less than its smallest plan (then over budget).
                room = budget - (weights + adapter + gradients + optimizer + logits)
                activations = max(activations, min(room, every_layer))

        if spec.method == "grpo":
            sequences = hp.batch_size * hp.gradient_accumulation
            kv_cache = s["layers"] * 2 * s["kv"] * act_bytes * sequences * hp.max_seq_len
            generation = kv_cache + sequences * s["vocab"] * (act_bytes + 4)  # the last token's logits, upcast to sample

    rewards = sum(reward_model_bytes(shape, weight_bytes, hp.max_seq_len) for shape in reward_models)
    # Generation and the training step take turns: the peak holds the larger of the two.
    subtotal = weights + adapter + gradients + optimizer + max(activations + logits, generation) + rewards
    overhead = subtotal // 20 + (CUDA_OVERHEAD_BYTES if device_kind == "cuda" else CPU_RUNTIME_BYTES)
    return {"parameters": parts["total"], "trainable_parameters": trainable, "lora_parameters": lora,
            "weights_bytes": weights + adapter, "gradients_bytes": gradients, "optimizer_bytes": optimizer,
            "activations_bytes": activations, "logits_bytes": logits, "generation_bytes": generation,
            "reward_models_bytes": rewards, "overhead_bytes": overhead,
            "total_bytes": subtotal + overhead, **experts}
