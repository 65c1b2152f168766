"""NF4 storage for a mixture of experts' stacked expert weights: QLoRA on the experts.

transformers' experts modules hold one projection of every expert as a 3-D parameter ([E, out, in], or
[E, in, out] for gpt-oss), which bitsandbytes (nn.Linear layers only) leaves in 16 bits. Here such a
parameter is stored in NF4, bitsandbytes' format and algorithm (quant/nf4.py) over the flattened stack
(each expert's weight is whole 64-value blocks whenever in * out is a multiple of 64), through torch's
parametrisation: the packed codes are the stored tensor (`parametrizations.<name>.original`, uint8, so a
cast of the model to another dtype leaves them alone), and reading the attribute gives a new dense
copy. Every plain reader (transformers' own forward with the adapters disabled, PEFT's shapes at
wrapping) works unchanged. The grouped kernels never hold that copy: `ExpertStackReader` dequantises
into one buffer per projection name, reused by every layer, just before the GEMMs in forward and again
in backward (kernels/moe.py).

What cannot work on such a weight, and says so: PEFT's own LoRA forward on it (it stacks a second
parametrisation that it then fails to remove: the experts run on the grouped kernels instead), and
merging into it (`dequantize_model` first, as for NF4Linear layers).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrize import type_before_parametrizations

from .nf4 import NF4Weight, dequantize, quantize_nf4
from .quantised_linear import shared_buffer


class NF4StackedWeight(nn.Module):
    """The parametrisation: forward dequantises the stored codes into a new tensor of the weight's dtype."""

    def __init__(self, nf4: NF4Weight):
        super().__init__()
        self._nf4 = nf4
        self._parametrizations = None  # the owner's list, to see PEFT's parametrisation stacked on this one

    def storage(self, packed: torch.Tensor) -> NF4Weight:
        """The NF4 weight over `packed` (the stored codes, wherever a move of the module put them)."""
        self._nf4 = self._nf4.over(packed.data)
        return self._nf4

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        if self._parametrizations is not None and len(self._parametrizations) > 1:
            raise RuntimeError(
                "these experts' weights are stored in NF4, which PEFT's own LoRA forward cannot adapt (it stacks "
                "its LoRA on the stored weight and fails to take it off again); they train on lanner.kernels' "
                "grouped kernels: keep the kernels on (a CUDA GPU, or TRITON_INTERPRET=1 on the CPU), or load the "
                "base in 16 bits")
        return dequantize(self.storage(packed))


def _stored(module: nn.Module, name: str) -> NF4StackedWeight | None:
    parametrizations = module._modules.get("parametrizations")
    if parametrizations is None or name not in parametrizations._modules:
        return None
    first = parametrizations._modules[name][0]
    return first if isinstance(first, NF4StackedWeight) else None


def nf4_stacked_names(module: nn.Module) -> list[str]:
    """The names of module's weights stored in NF4 here."""
    parametrizations = module._modules.get("parametrizations")
    return [] if parametrizations is None else [name for name in parametrizations._modules if _stored(module, name)]


def is_nf4_stacked(module: nn.Module, name: str) -> bool:
    """Whether `module.<name>` is stored in NF4 here (read without dequantising)."""
    return _stored(module, name) is not None


def store_nf4_stacked(module: nn.Module, name: str, double_quant: bool = True) -> None:
    """Replaces module's 3-D parameter `name` by its NF4 storage, in place (the dense one is freed)."""
    dense = getattr(module, name)
    if dense.dim() != 3:
        raise ValueError(f"NF4 expert storage holds a stacked [experts, rows, columns] weight, not {name} of shape "
                         f"{tuple(dense.shape)}")
    nf4 = quantize_nf4(dense.detach(), double_quant=double_quant)
    del dense
    # The codes are the stored tensor (`original`, frozen: uint8), the parametrisation what reads them.
    setattr(module, name, nn.Parameter(nf4.packed, requires_grad=False))
    parametrize.register_parametrization(module, name, NF4StackedWeight(nf4), unsafe=True)
    # A plain attribute, not a child module (the list holds this one); a deep copy maps it to the copy's list.
    object.__setattr__(module.parametrizations[name][0], "_parametrizations", module.parametrizations[name])


def stored_parameter(module: nn.Module, name: str) -> nn.Parameter:
    """The tensor module keeps for `name`: the parameter, or a parametrised one's stored original (the
    NF4 codes), read without computing the parametrised value."""
    parametrizations = module._modules.get("parametrizations")
    if parametrizations is not None and name in parametrizations._modules:
        stored = parametrizations._modules[name]
        return stored.original if stored.is_tensor else stored.original0
    return module._parameters[name]


def nf4_stacked_shape(module: nn.Module, name: str) -> torch.Size | None:
    """The dense shape of an NF4-stored stacked weight (None when `name` is not one)."""
    stored = _stored(module, name)
    return None if stored is None else stored._nf4.shape


class ExpertStackReader:
    """What the grouped kernels read for an NF4-stored stacked weight: called with the compute dtype, it
    dequantises into the buffer every layer's `name` shares (valid until the next layer's call), [E, out, in]
    (a transposed view where stored [E, in, out]). needed, a bool per expert, limits it to those experts (a few
    tokens' decoding step routes to a few of them); the others' slices hold whatever was there."""

    def __init__(self, module: nn.Module, name: str, transposed: bool = False):
        stored = _stored(module, name)
        if stored is None:
            raise ValueError(f"{type(module).__name__}.{name} is not stored in NF4")
        self.nf4, self.name, self.transposed = stored.storage(stored_parameter(module, name)), name, transposed
        experts, rows, columns = self.nf4.shape
        self.shape = torch.Size((experts, columns, rows) if transposed else (experts, rows, columns))

    def __call__(self, dtype: torch.dtype, needed: torch.Tensor | None = None) -> torch.Tensor:
        nf4 = self.nf4
        out = shared_buffer(nf4.numel(), nf4.device, dtype, f"experts.{self.name}")
        dense = dequantize(nf4, dtype, out=out, needed=needed)
        return dense.transpose(1, 2) if self.transposed else dense


@torch.no_grad()
def dense_stacked_(module: nn.Module, dtype: torch.dtype | None = None) -> None:
    """Gives module ordinary frozen parameters again, holding the dequantised weights (in `dtype`, default:
    the dtype each was quantised from), in place of its NF4-stored ones. Not through torch's
    remove_parametrizations where these are the module's only parametrisations: that deletes the attribute
    from the parametrised class, which a deep copy of the module shares (the copy would lose its weights)."""
    names = nf4_stacked_names(module)
    dense = {name: getattr(module, name) for name in names}
    parametrizations = module._modules["parametrizations"]
    if len(parametrizations) == len(names):
        module.__class__ = type_before_parametrizations(module)
        del module._modules["parametrizations"]
    else:
        for name in names:
            parametrize.remove_parametrizations(module, name, leave_parametrized=True)
            delattr(module, name)
    for name, weight in dense.items():
        module.register_parameter(name, nn.Parameter(weight.to(dtype or weight.dtype), requires_grad=False))


def dense_experts_(model: nn.Module, dtype: torch.dtype | None = None) -> int:
    """Every NF4-stored stacked weight of `model` back as a dense parameter (dense_stacked_, in `dtype`), so that
    PEFT's own forward can train the model (lanner.kernels off) or merge into it; the linear layers stay as they
    are. Returns how many modules changed."""
    stacked = [module for module in model.modules() if nf4_stacked_names(module)]
    for module in stacked:
        dense_stacked_(module, dtype)
    return len(stacked)
