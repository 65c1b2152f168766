"""How evenly a mixture-of-experts model's routers spread the tokens over their experts, per step.

A forward hook on each MoE block's router (Qwen3-MoE, Mixtral, gpt-oss: `mlp.gate` or `mlp.router`,
returning logits, routing weights and the chosen experts) adds, on the device, what the router did in
training mode: the (token, expert) assignments each expert got and the sum of the router's softmax
probabilities (forwards with gradients only: a no-grad pass such as GRPO's generation is not training).
It runs the same on lanner.kernels (which replace the experts, not the router) and on
plain PEFT. At each optimizer step's end the step's two figures are computed from the sums, still on
the device, and copied to host memory behind the step's work; they are read when the step is logged
(one step late on the kernels, lanner.worker.training.late_logging), so nothing waits for the GPU
per layer or per step.

The figures, per MoE layer over the step's tokens (padding left out when the batch has an attention
mask), averaged over the layers:
- router_aux_loss: the Switch Transformer's load-balancing loss, E * sum_i f_i * P_i, with f_i the
  share of the layer's routed assignments that went to expert i and P_i the router's mean probability
  for expert i. 1 when the routing is uniform, up to E when one expert takes everything.
  transformers' `aux_loss` for Mixtral and Qwen-MoE is top_k times this (its f sums to top_k).
- router_max_load: the busiest expert's share of the routed assignments over the mean share (E * max_i
  f_i): 1 when balanced; E / top_k when top_k experts take every token.
A layer whose router is recomputed under gradient checkpointing counts its tokens twice, which leaves
both ratios as they are.
"""
from __future__ import annotations

import torch
from torch import nn

from lanner.worker.training.late_logging import to_host_behind

# The step values this module adds to a logged step.
ROUTER_KEYS = ("router_aux_loss", "router_max_load")


def _routers(model: nn.Module) -> list[nn.Module]:
    """The router of every MoE block: a module beside an `experts` module."""
    found = []
    for block in model.modules():
        router = getattr(block, "gate", None) or getattr(block, "router", None)
        if isinstance(getattr(block, "experts", None), nn.Module) and isinstance(router, nn.Module):
            found.append(router)
    return found


class RouterBalance:
    """The routers' per-step load balance of an MoE model (None from `of` for a dense one)."""

    def __init__(self, model: nn.Module, routers: list[nn.Module]):
        self.layers = len(routers)
        self.counts = self.probabilities = None  # [layers, experts]: assignments, summed probabilities
        self.mask = None  # the current batch's attention mask, flattened
        self.pending: dict[int, tuple[torch.Tensor, torch.cuda.Event | None]] = {}
        for layer, router in enumerate(routers):
            router.register_forward_hook(self._counter(layer))
        model.register_forward_pre_hook(self._take_mask, with_kwargs=True)

    @classmethod
    def of(cls, model: nn.Module) -> RouterBalance | None:
        routers = _routers(model)
        return cls(model, routers) if routers else None

    def _take_mask(self, module, args, kwargs):
        mask = kwargs.get("attention_mask")
        self.mask = mask.reshape(-1) if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None

    def _counter(self, layer: int):
        def count(router: nn.Module, args, output):
            # Training forwards only: not evaluation, generation (GRPO) or a reference model's pass (DPO)
            if not (router.training and torch.is_grad_enabled()) or not isinstance(output, tuple) or len(output) != 3:
                return
            logits, _, chosen = output
            with torch.no_grad():
                logits = logits.detach().reshape(-1, logits.shape[-1])
                tokens, experts = logits.shape
                if self.counts is None:
                    self.counts = logits.new_zeros((self.layers, experts), dtype=torch.float32)
                    self.probabilities = torch.zeros_like(self.counts)
                weight = logits.new_ones(tokens, dtype=torch.float32)
                if self.mask is not None and self.mask.numel() == tokens:
                    weight = self.mask.to(device=logits.device, dtype=torch.float32)
                chosen = chosen.reshape(tokens, -1)
                self.counts[layer].index_add_(0, chosen.reshape(-1),
                                              weight[:, None].expand(chosen.shape).reshape(-1))
                self.probabilities[layer] += weight @ torch.softmax(logits.float(), dim=-1)
        return count

    def end_step(self, step: int) -> None:
        """The step's figures, computed on the device and copied to host memory without waiting; the
        sums start again from zero."""
        if self.counts is None:
            return
        experts = self.counts.shape[1]
        assigned = self.counts.sum(dim=1)
        ran = (assigned > 0).float()  # layers that saw tokens this step
        share = self.counts / assigned.clamp_min(1)[:, None]
        mean_probability = self.probabilities / self.probabilities.sum(dim=1).clamp_min(1e-30)[:, None]
        per_layer = torch.stack([experts * (share * mean_probability).sum(dim=1), experts * share.amax(dim=1)])
        values = (per_layer * ran).sum(dim=1) / ran.sum()  # nan when no layer ran
        self.counts.zero_()
        self.probabilities.zero_()
        self.pending[step] = to_host_behind(values)

    def step_values(self, step: int) -> dict[str, float]:
        """The figures of a step that `end_step` saw (and forgets it and any earlier one); {} when none."""
        found = self.pending.pop(step, None)
        for earlier in [key for key in self.pending if key < step]:
            del self.pending[earlier]
        if found is None:
            return {}
        values, ready = found
        if ready is not None:
            ready.synchronize()
        numbers = values.tolist()
        if any(number != number for number in numbers):  # nan: no routed token in the step
            return {}
        return dict(zip(ROUTER_KEYS, numbers))
