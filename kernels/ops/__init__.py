"""Pure Triton kernels (no model patching): each op is a forward kernel, a backward kernel, a wrapper
and a torch.autograd.Function."""
from .fused_linear_ce import fused_linear_cross_entropy
from .glu import geglu, swiglu
from .rmsnorm import rms_norm
from .rope import apply_rope, rope_cos_sin

__all__ = ["apply_rope", "fused_linear_cross_entropy", "geglu", "rms_norm", "rope_cos_sin", "swiglu"]
