"""Measuring the peak tensor memory of one call, on CPU and on CUDA.

    python -m cpcourse.attention          # naive vs fused attention, measured with it

`peak_memory(fn, *args, **kwargs) -> (result, peak_bytes)`: the most bytes of tensor storage
that were alive at once during the call, counting only storage allocated during the call
(inputs that already existed are not counted; the result is, while it is alive).

On CPU, PyTorch keeps no allocator statistics, so a `TorchDispatchMode` watches every operator
the call runs: a storage that comes out of an operator and was not one of its inputs' storages
is a new allocation; it is freed when the last tensor seen on it is garbage-collected (weakref
finalizers). Views and in-place ops share their input's storage and so add nothing, and
resizes are followed. What it cannot see is scratch a fused kernel allocates and frees inside
itself (the CPU flash kernel's per-thread buffers, tens of KB): the numbers are the tensors an
operator-level program holds, which is what the cost model predicts.
On CUDA the caching allocator's own counters are used (`max_memory_allocated`), scratch included.
"""

from __future__ import annotations

import gc
import os
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cpcourse.support.errors import InputError


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata  # identity of the StorageImpl, shared by views


class StorageTracker(TorchDispatchMode):
    """Counts live bytes of storages allocated by operators run under it; keeps the peak.

    with StorageTracker() as tracker:
        ...
    tracker.peak_bytes, tracker.current_bytes
    """

    def __init__(self):
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self.allocations = 0
        self._nbytes: dict[int, int] = {}   # storage key -> bytes counted for it
        self._refs: dict[int, int] = {}     # storage key -> live tensors seen on it

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_key(t) for t in tree_flatten((args, kwargs or {}))[0]
                  if isinstance(t, torch.Tensor) and _has_storage(t)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and _has_storage(t):
                self._see(t, is_input=_storage_key(t) in inputs)
        return out

    def _see(self, t: torch.Tensor, is_input: bool) -> None:
        key, nbytes = _storage_key(t), t.untyped_storage().nbytes()
        if key in self._nbytes:
            # A view or an in-place op on a storage we count: follow a resize, if any.
            self._add(nbytes - self._nbytes[key])
            self._nbytes[key] = nbytes
        elif is_input:
            return  # a view of, or a write into, storage that existed before the call
        else:
            self._nbytes[key] = nbytes
            self._refs[key] = 0
            self.allocations += 1
            self._add(nbytes)
        self._refs[key] += 1
        weakref.finalize(t, self._release, key)

    def _add(self, nbytes: int) -> None:
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)

    def _release(self, key: int) -> None:
        if key not in self._refs:
            return
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.current_bytes -= self._nbytes.pop(key)
            del self._refs[key]


def _has_storage(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and t.device.type != "meta"


def _on_cuda(args, kwargs) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_cuda for t in tree_flatten((args, kwargs))[0])


def host_memory_bytes() -> int:
    """This machine's physical memory in bytes (what all local ranks share)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require_fits(nbytes: int, what: str, fix: str, share: float = 0.8) -> None:
    """Refuse, before any process starts, a run whose tensors cannot fit in this machine's memory
    (`share` of it: the OS, Python and torch need the rest). The message carries the estimate."""
    have = host_memory_bytes()
    if nbytes > share * have:
        raise InputError(f"{what} needs about {nbytes / 1e9:,.3g} GB of tensors, more than this "
                         f"machine's {have / 1e9:,.1f} GB allows: {fix}")


def peak_memory(fn, *args, device: str | None = None, **kwargs):
    """Run `fn(*args, **kwargs)` and return `(result, peak_bytes)`.

    `peak_bytes` (int): the most bytes of tensor storage allocated during the call that were
    alive at the same moment. `device` is "cpu" or "cuda"; by default "cuda" when any tensor
    argument is on CUDA, else "cpu". Run under `torch.no_grad()` when measuring inference: with
    autograd on, saved activations are (correctly) counted too.
    """
    device = device or ("cuda" if _on_cuda(args, kwargs) else "cpu")
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        result = fn(*args, **kwargs)
        torch.cuda.synchronize()
        return result, int(torch.cuda.max_memory_allocated() - base)
    with StorageTracker() as tracker:
        result = fn(*args, **kwargs)
    return result, int(tracker.peak_bytes)
