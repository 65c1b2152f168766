"""Gated MLP blocks (gate/up/down with SwiGLU or GeGLU) on the fused LoRA MLP function."""
from torch import nn

from ..lora import gated_activation, lora_linear, lora_mlp
from ..memory.layer_run import current_layer_run
from ..peft_projections import first_blocker, lora_projection
from .binding import bind_forward, plain_forward
from .families import glu_activation


def _mlp_forward(mlp: nn.Module, x, *, activation: str, output_terms: dict | None = None):
    """output_terms: a dict for the down projection's rank-r term where the residual add takes it (lora_mlp's
    deferred; patching/layers.py)."""
    projections = (mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if first_blocker(projections) is not None:
        return plain_forward(mlp)(x)
    run = current_layer_run()
    if run is None:
        return lora_mlp(x, *(lora_projection(m) for m in projections), activation, deferred=output_terms)
    return lora_mlp(x, *(lora_projection(m) for m in projections), activation,
                    stash=run.mlp_stash, output_needed=run.mlp_output_needed, tile_rows=run.mlp_tile_rows,
                    dh_tile_rows=run.mlp_dh_tile_rows, after_backward=run.after_mlp_backward, deferred=output_terms)


def _fused_gate_up_mlp_forward(mlp: nn.Module, x, *, activation: str, output_terms: dict | None = None):
    """Phi-3: gate and up are the two halves of one gate_up_proj output."""
    projections = (mlp.gate_up_proj, mlp.down_proj)
    if first_blocker(projections) is not None:
        return plain_forward(mlp)(x)
    gate_up_p, down_p = (lora_projection(m) for m in projections)
    gate, up = lora_linear(x, gate_up_p).chunk(2, dim=-1)
    return lora_linear(gated_activation(activation, gate, up), down_p, output_terms)


def patch_mlp(mlp: nn.Module) -> str | None:
    """Patches a family MLP module; the reason when its activation or layout has no kernel (None: patched)."""
    act_fn = getattr(mlp, "act_fn", None) or getattr(mlp, "activation_fn", None)
    activation = glu_activation(act_fn) if act_fn is not None else None
    if activation is None:
        return f"no GLU kernel for its activation {type(act_fn).__name__}"
    if all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj")):
        bind_forward(mlp, _mlp_forward, activation=activation)
        return None
    if hasattr(mlp, "gate_up_proj") and hasattr(mlp, "down_proj"):
        bind_forward(mlp, _fused_gate_up_mlp_forward, activation=activation)
        return None
    return f"no kernel for the layout of {type(mlp).__name__}"
