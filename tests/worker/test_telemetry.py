import os

from lanner.core.messages.device import Device
from lanner.worker import telemetry


def test_a_process_peak_is_never_below_its_resident_size(monkeypatch):
    # The kernel's high-water mark (VmHWM) and resident size are read apart and counted approximately: a page
    # freed between the reads once left the mark a page under the resident size just read (a real CI failure).
    sample = telemetry.device_sampler(Device(kind="cpu", name="cpu", memory_total_bytes=1), os.getpid())
    real = sample()
    assert 0 < real.process_rss_bytes <= real.process_peak_rss_bytes

    monkeypatch.setattr(telemetry, "_peak_rss", lambda pid: 4096)  # a mark read after the resident size dropped
    behind = sample()
    assert behind.process_peak_rss_bytes == behind.process_rss_bytes > 4096
