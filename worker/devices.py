"""What device this worker owns: one GPU through NVML, or the CPU through psutil, as a Device
(lanner.core.messages.device)."""
from __future__ import annotations

import os
import platform

import psutil

from lanner.core.messages.device import Device
from lanner.core.settings import get_settings


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


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def gpu_uuids() -> list[str]:
    """Every GPU of this machine, whatever CUDA_VISIBLE_DEVICES says (NVML does not read it)."""
    nvml = _nvml()
    if not nvml:
        return []
    return [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(nvml.nvmlDeviceGetCount())]


def cpu_device(worker_name: str | None = None) -> Device:
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            name = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    host = get_settings().host_name
    return Device(kind="cpu", name=f"{name} ({psutil.cpu_count()} threads)",
                  memory_total_bytes=psutil.virtual_memory().total, id=f"cpu:{worker_name or host}", host=host)


def current_device(worker_name: str | None = None) -> Device:
    """The device this process trains on: the first GPU CUDA_VISIBLE_DEVICES shows it, or the CPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return cpu_device(worker_name)
    nvml = _nvml()
    if not nvml or nvml.nvmlDeviceGetCount() == 0:
        return cpu_device(worker_name)
    first = (visible or "0").split(",")[0].strip()
    handle = (nvml.nvmlDeviceGetHandleByUUID(first) if first.startswith(("GPU-", "MIG-"))
              else nvml.nvmlDeviceGetHandleByIndex(int(first)))
    return Device(kind="cuda", name=_text(nvml.nvmlDeviceGetName(handle)),
                  memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                  index=int(nvml.nvmlDeviceGetIndex(handle)), id=_text(nvml.nvmlDeviceGetUUID(handle)),
                  host=get_settings().host_name, machine=min(gpu_uuids()))


def free_memory(device: Device) -> int:
    """Bytes a new job could use on the device now: NVML's free memory for a GPU (what other
    processes hold is not free), the memory available to new processes for the CPU."""
    if device.kind == "cuda":
        nvml = _nvml()
        if nvml:
            return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByUUID(device.id)).free)
        return device.memory_total_bytes
    return int(psutil.virtual_memory().available)


def is_local(device: Device) -> bool:
    """Whether this process can run on the device: a GPU of this machine (containers of one box
    each see all its GPUs), or a CPU slot of this host. One job's ranks all run on one machine."""
    if device.kind == "cuda":
        return device.id in gpu_uuids()
    return device.host == get_settings().host_name
