"""The device record: what a worker owns (one GPU, or a CPU slot), as its heartbeat announces it in
the worker registry, as the queue places jobs on it, and as GET /api/health shows it.

A device's id names it in the device reservations (lanner.core.worker_registry): a GPU's UUID,
unique across hosts; for the CPU, `cpu:<worker name>`, so that several CPU workers of one machine
stand in for several GPUs (tests, and a CPU box that runs multi-process jobs).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

DeviceKind = Literal["cuda", "cpu"]
Strategy = Literal["ddp", "fsdp"]  # how a job on several devices spreads: replicas, or shards


class Device(BaseModel):
    kind: DeviceKind
    name: str
    memory_total_bytes: int
    index: int | None = None  # NVML's index of a GPU
    id: str | None = None
    host: str | None = None
    machine: str | None = None  # a GPU's box, the same in each container of it (its lowest GPU UUID)
    memory_free_bytes: int | None = None  # as its worker last measured it

    @property
    def machine_name(self) -> str | None:
        """The machine the device is on: a GPU's box (which containers of one box each name under
        their own host name), else its host."""
        return self.machine or self.host

    @property
    def capacity(self) -> int:
        """Bytes a job may use on the device: its free memory when measured, else its total."""
        return self.memory_total_bytes if self.memory_free_bytes is None else self.memory_free_bytes

    def with_free_memory(self, free_bytes: int | None) -> Device:
        return self.model_copy(update={"memory_free_bytes": free_bytes})

    def record(self) -> dict:
        """The JSON a job row keeps of where it runs (Job.device)."""
        return self.model_dump(mode="json")


class Placement(Device):
    """Where a job on several devices runs: the claiming worker's own device first, then the idle
    devices it borrowed, all of one machine; as a Device it sums their memory."""
    devices: list[Device]
    strategy: Strategy

    @classmethod
    def of(cls, devices: list[Device], strategy: Strategy) -> Placement:
        own = devices[0]
        return cls(kind=own.kind, name=f"{len(devices)} × {own.name}",
                   memory_total_bytes=sum(device.memory_total_bytes for device in devices),
                   index=own.index, id=own.id, host=own.host, machine=own.machine, devices=devices, strategy=strategy)


def devices_of(placement: Device) -> list[Device]:
    """The devices a job placed on `placement` runs on."""
    return placement.devices if isinstance(placement, Placement) else [placement]


class WorkerRecord(BaseModel):
    """A live worker, as the registry holds it."""
    name: str  # <name>@<host>
    device: Device
    last_seen: str
    host: str | None = None  # the worker host (LANNER_HOST_NAME) it runs on
    instance: str | None = None  # its process: a worker started again under the same name is another instance
    reserved_by: str | None = None  # the worker whose job holds this device (itself, or a multi-GPU job's)
