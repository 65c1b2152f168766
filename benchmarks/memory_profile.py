"""Where a training step's peak GPU memory goes: replays the CUDA caching allocator's trace of one
step (torch.cuda.memory._record_memory_history) and reports the peak, what allocation set it, and
the blocks alive at that moment grouped by where they were allocated.

Recording covers the forward only: torch 2.11 fails inside a non-reentrant checkpoint's recompute
while the history is recorded (pytorch/pytorch#179536). The backward is seen through PhasePeaks:
the peak between marks set as each decoder layer's backward begins.

Two curves are replayed: bytes allocated counting a block free when the program freed it
("requested"), and when the allocator could reuse it ("completed": a block used on another stream
through record_stream is only free once that stream's work on it is done). max_memory_allocated()
follows the second; a gap between the two is memory waiting on a side stream.

peer_bench.py calls it with --memory-profile FILE; alone: python memory_profile.py SNAPSHOT.pickle
"""
from __future__ import annotations

import pickle
import sys
from collections import defaultdict

_OURS = ("lanner", "/kernels/", "benchmarks/", "transformers/", "peft/", "torch/optim", "unsloth", "bitsandbytes")


def _site(frames) -> str:
    """The innermost two frames in code we or the peers wrote (torch internals skipped)."""
    picked = [f for f in frames if any(part in f["filename"] for part in _OURS)][:2]
    if not picked:
        picked = frames[:1]
    return " < ".join(f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in picked)


class PhasePeaks:
    """Allocated bytes and the peak since the previous mark, marked at the end of each decoder layer's
    forward, before the head, and as each layer's backward begins (a hook on its output's gradient)."""

    def __init__(self, model):
        import torch
        self.torch, self.rows, self.active = torch, [], False
        layers = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
        for index, layer in enumerate(layers):
            layer.register_forward_hook(self._forward_hook(index))

    def mark(self, label: str) -> None:
        if not self.active:
            return
        cuda = self.torch.cuda
        self.rows.append((label, cuda.memory_allocated(), cuda.max_memory_allocated()))
        cuda.reset_peak_memory_stats()

    def _forward_hook(self, index):
        def hook(_module, _inputs, output):
            if not self.active or not self.torch.is_grad_enabled():
                return
            self.mark(f"forward L{index} done")
            hidden = output[0] if isinstance(output, tuple) else output
            if hidden.requires_grad:
                hidden.register_hook(lambda grad: self.mark(f"backward L{index} starts"))
        return hook

    def report(self) -> str:
        gib = 2**30
        lines = ["phase peaks (GiB): label, allocated at the mark, peak since the previous mark"]
        lines += [f"  {label:24s} {now / gib:7.3f} {peak / gib:7.3f}" for label, now, peak in self.rows]
        return "\n".join(lines)


MARKER_BYTES = 12_345 * 512  # peer_bench allocates one block of this size just before the profiled step


def analyse(snapshot: dict, device: int = 0, top: int = 25, baseline: int = 0) -> str:
    """The peak after the last marker block; `baseline` is what was allocated when recording began
    (blocks allocated before it are not in the trace)."""
    trace = snapshot["device_traces"][device]
    start = max((i for i, e in enumerate(trace) if e["action"] == "alloc" and e.get("size") == MARKER_BYTES),
                default=0)
    completed = requested = baseline
    peak = (0, -1)
    peak_requested = 0
    timeline = []
    for index, event in enumerate(trace):
        action, size = event["action"], event.get("size", 0)
        if action == "alloc":
            completed += size
            requested += size
            if completed > peak[0] and index > start:
                peak = (completed, index)
        elif action == "free_requested":
            requested -= size
        elif action == "free_completed":
            completed -= size
        if index > start:
            peak_requested = max(peak_requested, requested)
            if action == "alloc":
                timeline.append((index, completed, requested, event))
    # replay again up to the peak to get the live set there
    live = {}
    freed_requested = set()
    for event in trace[: peak[1] + 1]:
        if event["action"] == "alloc":
            live[event["addr"]] = event
            freed_requested.discard(event["addr"])
        elif event["action"] == "free_requested":
            freed_requested.add(event["addr"])
        elif event["action"] == "free_completed":
            live.pop(event["addr"], None)
            freed_requested.discard(event["addr"])
    gib = 2**30
    by_site: dict[str, list] = defaultdict(lambda: [0, 0, 0])
    waiting = 0
    for addr, event in live.items():
        row = by_site[_site(event.get("frames", []))]
        row[0] += event["size"]
        row[1] += 1
        if addr in freed_requested:
            row[2] += event["size"]
            waiting += event["size"]
    lines = [f"trace events: {len(trace)}, profiled step from event {start}; allocated before: {baseline / gib:.3f} GiB",
             f"peak (allocator view, as max_memory_allocated): {peak[0] / gib:.3f} GiB at event {peak[1]}",
             f"peak if freed blocks were reusable at once: {peak_requested / gib:.3f} GiB",
             f"at the peak, freed by the program but waiting on another stream: {waiting / gib:.3f} GiB",
             f"allocation that set the peak ({trace[peak[1]]['size'] / 2**20:.1f} MiB): "
             f"{_site(trace[peak[1]].get('frames', []))}",
             "", "live at the peak, by allocation site (GiB, blocks, of which waiting on a stream GiB):"]
    for site, (size, count, wait) in sorted(by_site.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"  {size / gib:7.3f}  {count:5d}  {wait / gib:6.3f}  {site}")
    lines.append("")
    lines.append("timeline (every ~1/60 of the allocations: event, completed GiB, requested GiB, site):")
    step = max(1, len(timeline) // 60)
    for index, done, req, event in timeline[::step]:
        lines.append(f"  {index:7d} {done / gib:7.3f} {req / gib:7.3f}  {_site(event.get('frames', []))}")
    return "\n".join(lines)


def main() -> None:
    with open(sys.argv[1], "rb") as handle:
        print(analyse(pickle.load(handle)))


if __name__ == "__main__":
    main()
