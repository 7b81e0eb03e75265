"""Counting the bytes each rank sends, measured at the torch.distributed calls themselves.

    python -m pytest tests/dist/test_video_cp.py -q

    with count_bytes() as sent:
        out = temporal_attention_cp(q, k, v, method="ring")
    sent.total            # payload bytes this rank put on the wire to other ranks
    sent.by_op            # {"isend": ..., "all_to_all_single": ...}

The counter wraps the functions of `torch.distributed` for the duration of the block, so it
measures whatever code runs inside (our all-to-all, someone else's ring), not what we think that
code does. Only floating-point payloads count: the int64 shape/dtype agreement that
`cpcourse.support.groups.agree` runs before a collective is bookkeeping, not data, and the cost
model leaves it out too. Bytes a rank keeps for itself (its own slot of an all-to-all or all-gather)
do not count: they never cross a link. Single-threaded: one counter per process at a time.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# Not `isend`/`irecv`: `P2POp` checks its op by identity against torch's own isend, so a wrapped
# isend would break batched p2p; sends made through `batch_isend_irecv` are counted there.
_WRAPPED = ("send", "batch_isend_irecv", "all_to_all_single", "all_gather_into_tensor",
            "all_gather_single",
            "all_gather", "all_reduce", "reduce_scatter_tensor", "reduce_scatter_single",
            "broadcast")


@dataclass
class SentBytes:
    """What this rank sent inside one `count_bytes()` block: total and per op name."""

    total: int = 0
    by_op: dict = field(default_factory=dict)
    calls: int = 0
    by_group: dict = field(default_factory=dict)  # {process group: bytes}; WORLD for None

    def add(self, op: str, nbytes: int, group=None) -> None:
        self.total += int(nbytes)
        self.by_op[op] = self.by_op.get(op, 0) + int(nbytes)
        if nbytes:
            key = group if group is not None else dist.group.WORLD
            self.by_group[key] = self.by_group.get(key, 0) + int(nbytes)
        self.calls += 1


def _payload(t) -> int:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        return 0
    return t.numel() * t.element_size()


def _world(group) -> int:
    return dist.get_world_size(group)


def _bytes_of(name: str, args, kwargs) -> int:
    """Bytes sent to *other* ranks by one call of `torch.distributed.<name>`."""
    def get(i, key, default=None):
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "send":
        return _payload(get(0, "tensor"))
    if name == "batch_isend_irecv":
        ops = get(0, "p2p_op_list", [])
        return sum(_payload(op.tensor) for op in ops
                   if getattr(op.op, "__name__", "") in ("isend", "send"))
    group = kwargs.get("group")
    if name == "all_to_all_single":
        inp = get(1, "input")
        if _payload(inp) == 0:
            return 0
        splits = get(3, "input_split_sizes")
        rank, world = dist.get_rank(group), _world(group)
        rows = inp.shape[0]
        splits = list(splits) if splits else [rows // world] * world
        row_bytes = _payload(inp) // max(1, rows)
        return (rows - splits[rank]) * row_bytes
    if name in ("all_gather_into_tensor", "all_gather_single"):
        return _payload(get(1, "input_tensor")) * (_world(group) - 1)
    if name == "all_gather":
        return _payload(get(1, "tensor")) * (_world(get(2, "group")) - 1)
    if name == "all_reduce":
        # ring all-reduce: 2 (P - 1) / P of the buffer leaves each rank
        world = _world(get(2, "group"))
        return 2 * (world - 1) * _payload(get(0, "tensor")) // world
    if name in ("reduce_scatter_tensor", "reduce_scatter_single"):
        return _payload(get(1, "input")) * (_world(group) - 1) // _world(group)
    if name == "broadcast":
        src = get(1, "src")
        return _payload(get(0, "tensor")) * (_world(get(2, "group")) - 1) \
            if dist.get_rank() == src else 0
    return 0


def _group_of(name: str, args, kwargs):
    """The process group one call of `torch.distributed.<name>` runs on (None: the world)."""
    if name == "batch_isend_irecv":
        ops = args[0] if args else kwargs.get("p2p_op_list", [])
        return ops[0].group if ops else None
    if "group" in kwargs:
        return kwargs["group"]
    position = {"send": 2, "all_to_all_single": 4, "all_gather_into_tensor": 2,
                "all_gather_single": 2, "all_gather": 2, "all_reduce": 2,
                "reduce_scatter_tensor": 3, "reduce_scatter_single": 3,
                "broadcast": 2}.get(name)
    return args[position] if position is not None and len(args) > position else None


_ACTIVE: list[SentBytes] = []


@contextlib.contextmanager
def count_bytes():
    """Count the floating-point bytes this rank sends to other ranks inside the block.

    Yields a `SentBytes`. Nested blocks both count. The original functions are restored on exit,
    whatever happens inside.
    """
    counter = SentBytes()
    _ACTIVE.append(counter)
    originals = {}
    if len(_ACTIVE) == 1:
        for name in _WRAPPED:
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            originals[name] = fn

            def wrapper(*args, __name=name, __fn=fn, **kwargs):
                nbytes = _bytes_of(__name, args, kwargs)
                group = _group_of(__name, args, kwargs) if nbytes else None
                for c in _ACTIVE:
                    c.add(__name, nbytes, group)
                return __fn(*args, **kwargs)

            setattr(dist, name, functools.wraps(fn)(wrapper))
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)
        for name, fn in originals.items():
            setattr(dist, name, fn)
