"""Device telemetry: NVML for a GPU, psutil for the CPU and RAM. While a job runs, every 2 s on the
job's stream (with the job's own processes' CPU and memory on the CPU); the worker's heartbeat also
samples its device for the hardware stream."""
from __future__ import annotations

import threading
from collections.abc import Callable

import psutil

from lanner.core.messages.device import Device
from lanner.core.messages.records import DeviceReading

SAMPLE_SECONDS = 2.0


def _gpu_sampler(index: int) -> Callable[[], DeviceReading]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def sample() -> DeviceReading:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle)
        values = {"gpu_utilization_percent": utilisation.gpu}
        try:
            values["temperature_c"] = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
            values["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except pynvml.NVMLError:  # some boards do not report these
            pass
        return DeviceReading(kind="cuda", memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total),
                             **values)

    return sample


def _peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory (Linux's VmHWM); 0 where the system keeps none."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _cpu_sampler(pid: int | None) -> Callable[[], DeviceReading]:
    root = psutil.Process(pid) if pid else None
    known: dict[int, psutil.Process] = {}  # kept between samples: cpu_percent measures since the last call
    psutil.cpu_percent(None)

    def tree() -> list[psutil.Process]:
        """The job's process and its descendants (a multi-process job's ranks run under a launcher)."""
        try:
            current = [root, *root.children(recursive=True)]
        except psutil.Error:  # the process just ended
            return []
        for process in current:
            known.setdefault(process.pid, process)
        return [known[process.pid] for process in current]

    if root:
        for process in tree():
            process.cpu_percent(None)

    def sample() -> DeviceReading:
        memory, machine_cpu = psutil.virtual_memory(), psutil.cpu_percent(None)
        values = {}
        if root:
            cpu, rss, peak = 0.0, 0, 0
            for process in tree():
                try:
                    with process.oneshot():
                        cpu += process.cpu_percent(None)
                        resident = int(process.memory_info().rss)
                    rss += resident
                    # the kernel's high-water mark and resident count are approximations read apart: a page
                    # freed between the two reads left the mark one page under the resident size just read
                    mark = _peak_rss(process.pid)
                    peak += max(mark, resident) if mark else 0
                except psutil.Error:  # this one just ended
                    pass
            if rss:
                values["process_cpu_percent"], values["process_rss_bytes"] = cpu, rss
            if peak:  # a step's peak falls between two samples: the kernel keeps it
                values["process_peak_rss_bytes"] = peak
        return DeviceReading(kind="cpu", cpu_percent=machine_cpu,
                             memory_used_bytes=int(memory.total - memory.available),
                             memory_total_bytes=int(memory.total), **values)

    return sample


def device_sampler(device: Device, pid: int | None = None) -> Callable[[], DeviceReading]:
    """A sample of the device: of all of it, whoever uses it (the hardware view); on the CPU, with
    `pid`, also of that process and its descendants (a job's view)."""
    return _gpu_sampler(device.index) if device.kind == "cuda" else _cpu_sampler(pid)


class DeviceSampler(threading.Thread):
    """Calls `emit(sample)` every SAMPLE_SECONDS until stopped. For the CPU it also reports the
    training process's own CPU and resident memory."""

    def __init__(self, device: Device, emit: Callable[[DeviceReading], None], pid: int | None = None,
                 interval: float = SAMPLE_SECONDS):
        super().__init__(daemon=True, name="lanner-device-sampler")
        self.emit = emit
        self.interval = interval
        self._stop_event = threading.Event()
        self.sample = device_sampler(device, pid)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.emit(self.sample())
            except Exception:  # a failed sample must never stop the job
                pass

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)
