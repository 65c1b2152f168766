"""Where the GPU waited on the host: idle gaps in a profiled step, charged to the host code that ended them.

    python3 benchmarks/trace_gaps.py kernels-lanner-qwen3-8b-2048x4.txt.trace.json.gz [--min-us 20] [--top 25]

Reads the Chrome trace that peer_bench's --kernel-profile (and moe_bench's, grpo_bench's) writes beside its
table. The GPU's busy time is the union of its kernels, copies and memsets over all streams; a gap is a stretch
of at least --min-us microseconds with nothing on the GPU. Each gap is charged to the launch that ended it: the
kernel after the gap, its launch call on the host (matched by correlation id) and the host ops enclosing that
call, innermost last. Gaps are summed by that stack (autograd functions and Python-level ops; plain aten ops
below the innermost function are dropped), largest first, with the count and the longest.
--host adds where the host's time went: self time (own duration less its nested events') per op and Python
frame (a trace taken with_stack=True has the frames), summed over all threads, largest first. Recording the
frames slows the host several times over (moe_bench's profiled step idles ~54% against ~17% unprofiled): such a
trace says where the host holds the GPU up, not by how much.
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
from collections import defaultdict

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HOST_CATEGORIES = {"cpu_op", "user_annotation", "python_function"}
# Kernel launches: the runtime's, and the driver's (Triton launches through cuLaunchKernelEx).
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver"}


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def gaps(gpu_events: list[dict], min_us: float) -> list[tuple[float, float, dict]]:
    """(start, length, next event) for every idle stretch of at least min_us between GPU events."""
    found, busy_until = [], None
    for event in sorted(gpu_events, key=lambda e: e["ts"]):
        if busy_until is not None and event["ts"] - busy_until >= min_us:
            found.append((busy_until, event["ts"] - busy_until, event))
        end = event["ts"] + event.get("dur", 0)
        busy_until = end if busy_until is None else max(busy_until, end)
    return found


def by_thread(events: list[dict], categories: set[str]) -> dict[tuple, list[dict]]:
    """The events of these categories per (process, thread), by start time, an enclosing event first."""
    threads = defaultdict(list)
    for e in events:
        if e.get("cat") in categories:
            threads[(e["pid"], e["tid"])].append(e)
    return {key: sorted(spans, key=lambda e: (e["ts"], -e.get("dur", 0))) for key, spans in threads.items()}


def host_stack(launch: dict, host_by_thread: dict) -> tuple[str, ...]:
    """Names of the host ops on the launch's thread that enclose it, outermost first."""
    spans, starts = host_by_thread.get((launch["pid"], launch["tid"]), ([], []))
    i = bisect.bisect_right(starts, launch["ts"])
    stack = [e for e in spans[:i] if e["ts"] + e.get("dur", 0) >= launch["ts"]]
    names = [e["name"] for e in stack]
    functions = [i for i, name in enumerate(names) if not name.startswith("aten::")]
    return tuple(names[: functions[-1] + 1] if functions else names[-1:])


def host_self_times(events: list[dict]) -> dict[str, list]:
    """name -> [self microseconds, count] over host ops and Python frames, nesting taken per thread."""
    totals = defaultdict(lambda: [0.0, 0])
    for spans in by_thread(events, HOST_CATEGORIES | LAUNCH_CATEGORIES).values():
        stack = []  # [event, children's time]
        for e in spans + [None]:
            while stack and (e is None or e["ts"] >= stack[-1][0]["ts"] + stack[-1][0].get("dur", 0)):
                done, children = stack.pop()
                total = totals[done["name"][:100]]
                total[0] += done.get("dur", 0) - children; total[1] += 1
                if stack:
                    stack[-1][1] += done.get("dur", 0)
            if e is not None:
                stack.append([e, 0.0])
    return totals


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--min-us", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--host", action="store_true", help="also the host's self time by op and Python frame")
    args = parser.parse_args()
    events = [e for e in load(args.trace) if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})}
    host_by_thread = {key: (spans, [e["ts"] for e in spans]) for key, spans in by_thread(events, HOST_CATEGORIES).items()}
    span = max(e["ts"] + e.get("dur", 0) for e in gpu) - min(e["ts"] for e in gpu)
    found = gaps(gpu, args.min_us)
    by_stack = defaultdict(lambda: [0.0, 0, 0.0])
    for _, length, after in found:
        launch = launches.get(after.get("args", {}).get("correlation"))
        stack = host_stack(launch, host_by_thread) if launch else ("(no launch found)",)
        total = by_stack[stack + (after["name"][:60],)]
        total[0] += length; total[1] += 1; total[2] = max(total[2], length)
    idle = sum(length for _, length, _ in found)
    print(f"GPU timeline {span / 1000:.1f} ms; idle in gaps >= {args.min_us:g} us: {idle / 1000:.1f} ms "
          f"({100 * idle / span:.1f}%) in {len(found)} gaps")
    for stack, (total, count, longest) in sorted(by_stack.items(), key=lambda item: -item[1][0])[: args.top]:
        print(f"{total / 1000:8.2f} ms {count:5d} gaps (longest {longest / 1000:.2f} ms)  {' > '.join(stack)}")
    if args.host:
        print("host self time (all threads), largest first:")
        for name, (total, count) in sorted(host_self_times(events).items(), key=lambda item: -item[1][0])[: args.top]:
            print(f"{total / 1000:8.2f} ms {count:6d}x  {name}")


if __name__ == "__main__":
    main()
