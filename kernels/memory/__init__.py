"""The memory engine: checkpointing that skips what backward does not need, layer inputs offloaded to
host memory, and a budget planner that keeps the activations dearest to recompute."""
from .engine import MemoryEngine, install_memory_engine, memory_engine_of, use_expandable_segments
from .planner import LayerCosts, LayerPlan, MemoryPlan, plan_memory

__all__ = ["LayerCosts", "LayerPlan", "MemoryEngine", "MemoryPlan", "install_memory_engine", "memory_engine_of",
           "plan_memory", "use_expandable_segments"]
