"""RMSNorm modules on the rms_norm kernel."""
from torch import nn

from ..ops.rmsnorm import rms_norm
from .binding import bind_forward


def _rms_norm_forward(module: nn.Module, hidden_states, *, offset: float, cast_before_weight: bool):
    return rms_norm(hidden_states, module.weight, module._lanner_eps, offset=offset, cast_before_weight=cast_before_weight)


def is_rms_norm(module: nn.Module) -> bool:
    has_eps = hasattr(module, "variance_epsilon") or hasattr(module, "eps")
    return type(module).__name__.endswith("RMSNorm") and has_eps and isinstance(getattr(module, "weight", None), nn.Parameter)


def patch_rms_norm(module: nn.Module, offset: float, cast_before_weight: bool) -> None:
    eps = module.variance_epsilon if hasattr(module, "variance_epsilon") else module.eps
    object.__setattr__(module, "_lanner_eps", float(eps))
    bind_forward(module, _rms_norm_forward, offset=offset, cast_before_weight=cast_before_weight)
