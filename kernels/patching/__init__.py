"""Model patching: which families are known, and putting their hot paths on the kernels."""
from .apply import PatchReport, patch_model, unpatch_model
from .families import FAMILIES

__all__ = ["FAMILIES", "PatchReport", "patch_model", "unpatch_model"]
