"""What device this worker owns: one GPU through NVML, or the CPU through psutil."""
from __future__ import annotations

import os
import platform

import psutil


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no driver, no library, no GPU: all mean "no NVML here"
        return None


def gpu_count() -> int:
    nvml = _nvml()
    return nvml.nvmlDeviceGetCount() if nvml else 0


def gpu_uuids() -> list[str]:
    nvml = _nvml()
    if not nvml:
        return []
    uuids = [nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(nvml.nvmlDeviceGetCount())]
    return [u.decode() if isinstance(u, bytes) else u for u in uuids]


def cpu_device() -> dict:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            name = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"kind": "cpu", "name": f"{name} ({psutil.cpu_count()} threads)",
            "memory_total_bytes": psutil.virtual_memory().total, "index": None}


def current_device() -> dict:
    """The device this process trains on: the first GPU CUDA_VISIBLE_DEVICES shows it, or the CPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return cpu_device()
    nvml = _nvml()
    if not nvml or nvml.nvmlDeviceGetCount() == 0:
        return cpu_device()
    first = (visible or "0").split(",")[0].strip()
    handle = (nvml.nvmlDeviceGetHandleByUUID(first) if first.startswith(("GPU-", "MIG-"))
              else nvml.nvmlDeviceGetHandleByIndex(int(first)))
    name = nvml.nvmlDeviceGetName(handle)
    return {"kind": "cuda", "name": name.decode() if isinstance(name, bytes) else name,
            "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
            "index": int(nvml.nvmlDeviceGetIndex(handle))}
