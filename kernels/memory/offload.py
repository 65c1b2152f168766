"""Tensors kept in host memory between a layer's forward and its recompute: checkpointed layer
inputs, and the MLP up projections of layers whose stash lives on the host.

Each is copied to a pinned host buffer on a side CUDA stream as soon as it exists (overlapping the
compute that follows) and its GPU memory is released once that copy has read it. The host is kept
at most a few copies ahead of: the CPU waits for the copy issued `_COPIES_IN_FLIGHT` items ago,
because the caching allocator can reuse a released block only once its copy is seen complete, and
a CPU far ahead of the GPU would otherwise count every released input as still allocated. In
backward the layers are recomputed last to first, and each copy back overlaps compute on the side
stream: fetching a layer's input starts bringing back the previous layer's input; the previous
layer's up projection (3.5 times larger on the 8B shape) starts coming back only when this layer's
MLP backward has let go of its own gate, up and dh, so the two never share the peak, and arrives
while this layer's attention backward and the previous layer's attention recompute run. On a CPU
device (tests) the copies are plain, synchronous ones.
"""
from __future__ import annotations

import weakref
from collections import deque

import numpy
import torch

from ..lora import MLPStash

_COPIES_IN_FLIGHT = 4
_SMALLEST_OFFLOADED = 2**20  # smaller tensors (rank-r products) stay on the GPU


def pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Page-locked host memory of exactly `numel` elements. torch's pinned allocator rounds every block
    up to a power of two, so the 31 offloaded inputs of Llama-3 8B at 376,832 tokens (2.875 GiB each)
    would lock 124 GiB of host memory instead of 89: here plain host memory is registered with CUDA,
    and unregistered when the last tensor viewing it is gone, just before it is freed."""
    nbytes = numel * dtype.itemsize
    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    array = numpy.empty(nbytes, dtype=numpy.uint8)
    cudart = torch.cuda.cudart()
    error = int(cudart.cudaHostRegister(array.ctypes.data, nbytes, 0))
    if error:
        raise RuntimeError(f"lanner.kernels: could not page-lock {nbytes / 2**30:.2f} GiB of host memory for "
                           f"offloaded activations (CUDA error {error}); turn checkpoint offloading off")
    weakref.finalize(array, cudart.cudaHostUnregister, array.ctypes.data).atexit = False  # exit frees it anyway
    return torch.from_numpy(array).view(dtype)


class OffloadedTensor:
    """One tensor: on the GPU until released, in host memory until its recompute fetches it."""

    def __init__(self, offloader: "HostOffloader", tensor: torch.Tensor, index: int, stashed: bool):
        self._offloader, self.index, self._generation = offloader, index, offloader.generation
        self.stashed = stashed  # an MLP stash's tensor (else a layer input)
        self._device, self.requires_grad = tensor.device, tensor.requires_grad
        self._forward_tensor: torch.Tensor | None = tensor
        self._host: torch.Tensor | None = offloader.to_host(tensor, index)
        self._fetched: torch.Tensor | None = None
        self._ready: torch.cuda.Event | None = None  # set while the copy back to the GPU is in flight

    def release(self) -> None:
        """The forward is done with it: drop the GPU copy (the host copy is being written on the side stream)."""
        self._forward_tensor = None

    @property
    def in_host(self) -> bool:
        """Released, and not yet fetched or on its way back."""
        return self._host is not None and self._fetched is None and self._forward_tensor is None

    def prefetch(self) -> None:
        if self.in_host:
            self._fetched, self._ready = self._offloader.to_device(self._host, self._device)

    def get(self) -> torch.Tensor:
        """Before release, the tensor itself; after, a GPU copy that requires grad as the original did
        (torch.utils.checkpoint does the same for the tensors it holds)."""
        if self._forward_tensor is not None:
            return self._forward_tensor
        if self._generation != self._offloader.generation:
            raise RuntimeError("lanner.kernels: an offloaded checkpoint was overwritten by a later forward before "
                               "its backward ran; run backward once after each forward")
        if not self.stashed:
            self._offloader.prefetch_previous_input(self.index)
        self.prefetch()
        if self._ready is not None:
            torch.cuda.current_stream(self._device).wait_event(self._ready)
        tensor, self._fetched, self._host, self._ready = self._fetched, None, None, None
        if tensor is None:
            raise RuntimeError("lanner.kernels: an offloaded checkpoint was recomputed twice")
        return tensor.detach().requires_grad_(self.requires_grad)


class OffloadedStash(MLPStash):
    """An MLP stash whose large tensors wait in host memory (see lora.MLPStash)."""

    def __init__(self, offloader: "HostOffloader", keep=("up",)):
        super().__init__(keep)
        self._offloader = offloader

    def _hold(self, tensor):
        if tensor is None or tensor.numel() * tensor.element_size() < _SMALLEST_OFFLOADED:
            return tensor
        held = self._offloader.hold(tensor, stashed=True)
        held.release()  # the MLP's forward is over when it stores
        return held

    @staticmethod
    def _get(value):
        return value.get() if isinstance(value, OffloadedTensor) else value

    def store(self, activations: dict) -> None:
        self.activations = {name: tuple(self._hold(t) for t in value) if isinstance(value, tuple) else self._hold(value)
                            for name, value in activations.items()}

    def take(self) -> dict | None:
        held = super().take()
        if held is None:
            return None
        return {name: tuple(self._get(t) for t in value) if isinstance(value, tuple) else self._get(value)
                for name, value in held.items()}


class HostOffloader:
    """Pinned host buffers (one per item, reused every step) and the side stream for the copies."""

    def __init__(self):
        self._buffers: dict[int, torch.Tensor] = {}
        self._stream: torch.cuda.Stream | None = None
        self._held: list[OffloadedTensor] = []
        self._copies: deque = deque()
        self.generation = 0

    def begin_step(self) -> None:
        """A new forward begins: tensors still held from an earlier one can no longer be recomputed."""
        self.generation += 1
        self._held = []

    def drop_buffers(self) -> None:
        """Frees every host buffer, for a new plan whose items differ (a tiled MLP sends no up
        projection): buffers are kept by item number, and the old plan's would stay locked."""
        if self._stream is not None:
            self._stream.synchronize()
        self._buffers.clear()

    def hold(self, tensor: torch.Tensor, stashed: bool = False) -> OffloadedTensor:
        held = OffloadedTensor(self, tensor, len(self._held), stashed)
        self._held.append(held)
        return held

    def prefetch_previous_input(self, index: int) -> None:
        """Starts bringing back the layer input held last before item `index`."""
        for item in reversed(self._held[:index]):
            if not item.stashed:
                item.prefetch()
                return

    def prefetch_last_stash(self) -> None:
        """Starts bringing back the last stash still in host memory (its tensors were held one after
        another): the memory engine calls it when an MLP backward is over, for the layer before,
        whose up projection is needed next."""
        items = reversed(self._held)
        for item in items:
            if item.stashed and item.in_host:
                item.prefetch()
                break
        for item in items:
            if not item.stashed:
                break
            item.prefetch()

    def host_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())

    def _host_buffer(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        buffer = self._buffers.get(index)
        if buffer is None or buffer.numel() < tensor.numel() or buffer.dtype != tensor.dtype:
            if buffer is not None and self._stream is not None:
                self._stream.synchronize()  # no copy still reads or writes the buffer given up
            numel, dtype = tensor.numel(), tensor.dtype
            buffer = pinned_empty(numel, dtype) if tensor.is_cuda else torch.empty(numel, dtype=dtype)
            self._buffers[index] = buffer
        return buffer[: tensor.numel()].view(tensor.shape)

    def _side_stream(self, device) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream

    def to_host(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        # Detached: a copy recorded by autograd would chain every step's graph onto the reused host
        # buffer, keeping each step's activations (the embeddings' output and its gradient) alive.
        tensor = tensor.detach()
        host = self._host_buffer(tensor, index)
        if not tensor.is_cuda:
            return host.copy_(tensor)
        stream = self._side_stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(stream):
            host.copy_(tensor, non_blocking=True)
            done = torch.cuda.Event()
            done.record(stream)
        tensor.record_stream(stream)  # its memory is not reused before the copy has read it
        self._copies.append(done)
        while len(self._copies) > _COPIES_IN_FLIGHT:
            self._copies.popleft().synchronize()
        return host

    def to_device(self, host: torch.Tensor, device: torch.device):
        if device.type != "cuda":
            return host.clone(), None
        stream = self._side_stream(device)
        tensor = torch.empty(host.shape, dtype=host.dtype, device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            tensor.copy_(host, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
        # No record_stream: the compute stream waits on `ready` before its first use, so its own
        # later free and reuse come after the copy.
        return tensor, ready
