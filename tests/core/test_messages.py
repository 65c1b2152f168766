"""Typed messages between processes: the device record through the worker registry, the cancel
signal, and the training record's stream entries ({"type", "data"}: only the fields set)."""
from __future__ import annotations

import subprocess
import sys
import uuid

from redis import Redis

from lanner.core.messages.device import Device, Placement, devices_of
from lanner.core.messages.records import RECORD_EVENTS, CancelRequested, JobEventType, StatusChange, StepMetrics
from lanner.core.messages.signals import CANCEL_FLAG_SECONDS, cancel_requested, clear_cancel, request_cancel
from lanner.core.models import JobStatus
from lanner.core.streams import publish, read_after
from lanner.core.worker_registry import announce_worker, largest_machine, live_workers, retire_worker

from support import SYSTEM_REDIS_URL

GIB = 2**30


def _redis() -> Redis:
    return Redis.from_url(SYSTEM_REDIS_URL, decode_responses=True)


def test_a_device_places_by_its_free_memory_and_its_machine():
    gpu = Device(kind="cuda", name="H200", memory_total_bytes=140 * GIB, index=0, id="GPU-b", host="c1", machine="GPU-a")
    assert gpu.capacity == 140 * GIB and gpu.with_free_memory(9 * GIB).capacity == 9 * GIB
    assert gpu.machine_name == "GPU-a" and gpu.model_copy(update={"machine": None}).machine_name == "c1"
    pair = Placement.of([gpu, gpu.model_copy(update={"id": "GPU-c"})], "fsdp")
    assert (pair.name, pair.memory_total_bytes, pair.id) == ("2 × H200", 280 * GIB, "GPU-b")
    assert [device.id for device in devices_of(pair)] == ["GPU-b", "GPU-c"] and devices_of(gpu) == [gpu]


def test_the_registry_hands_back_the_device_a_worker_announced():
    redis, name = _redis(), f"cpu-{uuid.uuid4().hex}@test"
    device = Device(kind="cpu", name="cpu", memory_total_bytes=8 * GIB, id=f"cpu:{name}", host="test",
                    memory_free_bytes=6 * GIB)
    try:
        announce_worker(redis, name, device)
        record = next(record for record in live_workers(redis) if record.name == name)
        assert record.device == device and record.reserved_by is None
        assert largest_machine([record]) == 1
    finally:
        retire_worker(redis, name)


def test_the_cancel_signal_is_set_read_and_cleared_and_expires():
    redis, job_id = _redis(), 10**9 + uuid.uuid4().int % 10**6
    assert not cancel_requested(redis, job_id)
    request_cancel(redis, job_id)
    assert cancel_requested(redis, job_id)
    assert 0 < redis.ttl(f"lanner:job:{job_id}:cancel") <= CANCEL_FLAG_SECONDS
    clear_cancel(redis, job_id)
    assert not cancel_requested(redis, job_id)


def test_each_event_type_has_one_model():
    assert sorted(event.TYPE for event in RECORD_EVENTS) == sorted(JobEventType)


def test_record_events_go_on_the_stream_as_type_and_the_fields_set():
    redis, stream = _redis(), f"lanner:test:{uuid.uuid4().hex}"
    device = Device(kind="cpu", name="cpu", memory_total_bytes=GIB, id="cpu:a")
    placement = Placement.of([device, device.model_copy(update={"id": "cpu:b"})], "ddp")
    events = [StepMetrics(step=1, loss=2.5, num_tokens=64.0), CancelRequested(by=3),
              StatusChange(status=JobStatus.running, error=None, worker="cpu0@a", device=placement)]
    try:
        for event in events:
            publish(redis, stream, event.TYPE, event.data())
        entries = read_after(redis, stream)
    finally:
        redis.delete(stream)
    assert [event_type for _, event_type, _ in entries] == [JobEventType.metric, "cancel_requested", "status"]
    assert entries[0][2] == {"step": 1, "loss": 2.5, "num_tokens": 64.0}
    assert entries[1][2] == {"by": 3}
    status = StatusChange.model_validate(entries[2][2])
    assert entries[2][2]["error"] is None and status.device == placement and status.device.strategy == "ddp"


def test_the_training_code_imports_the_ranks_without_the_launcher_or_a_training_process():
    loaded = subprocess.run([sys.executable, "-c", "import sys, lanner.worker.distributed.ranks, lanner.worker.events; "
                             "print(sorted(m for m in sys.modules if m.startswith('lanner.worker')))"],
                            capture_output=True, text=True, check=True).stdout
    assert "launcher" not in loaded and "train_process" not in loaded and "rank_process" not in loaded
