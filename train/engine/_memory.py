"""How much a batched fit may hold on the training device, and how data crosses between host and device.

    n = seeds_per_chunk(bytes_per_seed, free_device_bytes(device))  # seeds one batched fit holds at once
    idx = to_device(rows, device)                # pinned, asynchronous on CUDA: no stall per step
    read = HostRead({"loss": loss})              # the copy to the host queued now ...
    read.result()["loss"]                        # ... waited for here, after the host queued more work

Memory: a batched fit holds several seeds' parameters at once (`seeds_per_chunk`); on CUDA the budget is a
share of the device's free memory (`free_device_bytes`), on the host a fixed PARAM_BUDGET_BYTES. Data
crosses to the device with `to_device` (pinned, asynchronous: no stall per step) and results come back with
`to_host` (one copy for several tensors) or `HostRead` (the copy queued now, waited for later, so the host
can queue the next work first: a training step's only wait for the device, issue 31). Per-slice clipping
splits the same way (clipping.SliceClip): its "does any slice clip" flag is read with the step's other
numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from lightning_fabric.utilities.apply_func import apply_to_collection

PARAM_BUDGET_BYTES = 3 * 2**30  # host memory for the parameters (and their copies) of one batched fit
# on CUDA, the share of the free device memory a batched fit's parameter copies may take; the rest is
# headroom for activations, the training rows, evaluation chunks and the allocator's fragmentation
DEVICE_MEMORY_SHARE = 0.75


def free_device_bytes(device: str | torch.device) -> int | None:
    """Bytes a new allocation can get on a CUDA device; None on other devices (the host budget applies).

    The driver's free memory plus what torch's caching allocator holds but does not use (freed tensors of an
    earlier fit stay reserved, invisible to the driver).
    """
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))


def seeds_per_chunk(bytes_per_seed: int, free_bytes: int | None) -> int:
    """How many seeds one batched fit may hold (at least 1).

    `bytes_per_seed`: the memory one seed's parameters and their copies take; `free_bytes`: what the device
    has free (free_device_bytes), None on the host. The budget is DEVICE_MEMORY_SHARE of the free memory on
    a device, PARAM_BUDGET_BYTES on the host.
    """
    budget = PARAM_BUDGET_BYTES if free_bytes is None else int(free_bytes * DEVICE_MEMORY_SHARE)
    return max(1, budget // max(1, int(bytes_per_seed)))


def to_device(array: np.ndarray | torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """A host array as a tensor on `device`, without stalling the host on CUDA.

    A plain .to("cuda") from pageable memory waits for everything queued on the device (once per training
    step for batch indices and dropout masks); a pinned staging copy goes asynchronously (torch keeps the
    pinned block until the copy is done). Elsewhere: .to(device).
    """
    if isinstance(array, torch.Tensor):
        t = array
    else:
        t = torch.from_numpy(np.asarray(array))  # on the host, whatever torch's default device is
    dev = torch.device(device)
    if dev.type != "cuda":
        return t.to(dev)
    return t.contiguous().pin_memory().to(dev, non_blocking=True)  # contiguous: one plain async copy


class HostRead:
    """Small device tensors on their way to the host: the copy is queued now, the host waits only in `result`.

    On CUDA the values go into pinned memory behind the work already queued (non_blocking copy + an event),
    so the host can queue more work (a backward pass) before it waits, and the device never idles while the
    host reads. Elsewhere the copy is made at once. Values and shapes are kept; every tensor comes back as
    float64 (exact for float32, float64 and bool inputs).
    """

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.shapes = {key: t.shape for key, t in tensors.items()}
        self.event = None
        if not tensors:
            self.flat = torch.zeros(0, dtype=torch.float64, device="cpu")
            return
        flat = torch.cat([t.detach().reshape(-1).double() for t in tensors.values()])
        if flat.device.type == "cuda":
            self.flat = torch.empty(flat.shape, dtype=flat.dtype, device="cpu", pin_memory=True)
            self.flat.copy_(flat, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.flat = flat.cpu()

    def result(self) -> dict[str, torch.Tensor]:
        """The tensors on the host (waits for the copy, once)."""
        if self.event is not None:
            self.event.synchronize()
            self.event = None
        out, start = {}, 0
        for key, shape in self.shapes.items():
            n = math.prod(shape)
            out[key] = self.flat[start : start + n].view(shape)
            start += n
        return out


def to_host(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Several small tensors copied to the host in ONE transfer (one device synchronization, not one each).

    Values and shapes are kept; every tensor comes back as float64 (exact for float32 and float64 inputs).
    """
    return HostRead(tensors).result()


def state_to_host(obj: Any) -> Any:
    """A state (nested dicts/lists/tuples of tensors and plain values) with every tensor on the host."""
    return apply_to_collection(obj, torch.Tensor, lambda t: t.detach().cpu())
