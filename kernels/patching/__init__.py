"""Model patching: which families are known, and putting their hot paths on the kernels."""
from .apply import PatchReport, layers_unpatched, patch_model, unpatch_model
from .families import FAMILIES
from .loss import has_fused_loss

__all__ = ["FAMILIES", "PatchReport", "has_fused_loss", "layers_unpatched", "patch_model", "unpatch_model"]
