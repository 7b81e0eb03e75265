"""Process-group helpers every CP function shares: a short-timeout init, agreement, heartbeats.

    cpcourse demo --nproc 2      # runs them under cpcourse.launch

- `init()` starts the default process group (gloo on CPU, NCCL when every local rank has a GPU)
  with a timeout of seconds, not gloo's 30 minutes, so a mismatched collective fails instead of
  hanging. It is idempotent and is called for you by `cpcourse.launch` and `%%torchrun`.
- The sequence split itself (`shard_sizes`, `shard`, `unshard`) is `cpcourse.support.shards`.
- `agree(group, q=q, k=k, v=v)`: one cheap all-gather of shapes and dtypes so that inputs which
  differ across ranks raise the same clear `InputError` on every rank, never a hang or SIGABRT.
- `tracked(op, ...)`: records the communication a rank is in (a heartbeat file read by the
  launcher), so a deadlock is reported as "rank 1 stuck in recv from rank 0", not a bare timeout.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from cpcourse.support.errors import InputError, require

ENV_TIMEOUT = "CPCOURSE_PG_TIMEOUT"  # seconds; set by cpcourse.launch
ENV_RUN_DIR = "CPCOURSE_RUN_DIR"  # where the launcher looks for heartbeats and results
ENV_BACKEND = "CPCOURSE_BACKEND"
DEFAULT_TIMEOUT_S = 30.0

# Codes for the metadata all-gather; anything else is sent as -1 (and reported by name locally).
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32)
_MAX_DIMS = 6


def default_backend() -> str:
    """nccl when this node has a GPU for every local rank, else gloo."""
    forced = os.environ.get(ENV_BACKEND, "").strip()
    if forced:
        return forced
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        return "nccl"
    return "gloo"


def pg_timeout_s() -> float:
    """Seconds every process group waits in a collective: CPCOURSE_PG_TIMEOUT (set by
    cpcourse.launch), else 30 s, not c10d's 30 minutes."""
    return float(os.environ.get(ENV_TIMEOUT) or DEFAULT_TIMEOUT_S)


def init(backend: str | None = None, timeout_s: float | None = None) -> tuple[int, int]:
    """Initialise the default process group from torchrun's env vars; returns (rank, world).

    Does nothing (but return rank and world) when a group already exists.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    require("RANK" in os.environ and "WORLD_SIZE" in os.environ,
            "no torchrun environment (RANK, WORLD_SIZE): start this code with "
            "cpcourse.launch(...) or a %%torchrun cell")
    backend = backend or default_backend()
    timeout_s = float(timeout_s or pg_timeout_s())
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def require_group(group=None, what: str = "this function") -> tuple[int, int]:
    """(rank, world) in `group`, or an InputError when torch.distributed is not initialised."""
    require(dist.is_available() and dist.is_initialized(),
            f"{what} needs an initialised process group: run it under cpcourse.launch(...) or in "
            "a %%torchrun cell (or call cpcourse.support.groups.init() in a torchrun script)")
    return dist.get_rank(group), dist.get_world_size(group)


def forward_only(what: str, *tensors, use: str = "") -> None:
    """Refuse inputs that want a gradient on a path whose communication has no backward.

    Called before any communication, so every rank refuses together instead of one rank leaving
    the others waiting in a collective. Under torch.no_grad() / inference_mode() it passes.
    `use`: the differentiable path to name instead (ring_attention and ulysses_attention are).
    """
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in tensors):
        raise InputError(f"{what} is forward only (its communication has no backward yet): "
                         "wrap the call in torch.no_grad() or torch.inference_mode()"
                         + (f"; to train, use {use}" if use else ""))


def global_rank(group, group_rank: int) -> int:
    """The global rank of `group_rank` in `group` (p2p calls take global ranks)."""
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def comm_device(group=None) -> torch.device:
    """Where collective buffers must live: CUDA for NCCL, CPU for gloo."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gather_uneven(x: torch.Tensor, sizes: list[int], dim: int = 1, group=None,
                  what: str = "gather_uneven") -> torch.Tensor:
    """Every rank's `x` (sizes[r] long along `dim`, equal elsewhere) -> all of them, in rank
    order along `dim`, on each rank. gloo cannot all-gather unequal sizes: pad to the longest,
    all-gather, drop the padding. `what` names the call in the heartbeat."""
    most, world = max(sizes), len(sizes)
    moved = x.movedim(dim, 0)
    pad = moved.new_zeros(most, *moved.shape[1:])
    pad[:moved.shape[0]] = moved
    buf = torch.empty(world * most, *moved.shape[1:], dtype=x.dtype, device=comm_device(group))
    with tracked(f"all_gather ({what})", group=group):
        all_gather_single(buf, pad.to(buf.device), group=group)
    buf = buf.view(world, most, *moved.shape[1:])
    return torch.cat([buf[r, :n] for r, n in enumerate(sizes)]).movedim(0, dim).to(x.device)


# --- agreement across ranks ---------------------------------------------------------------------

def _encode(t: torch.Tensor) -> list[int]:
    dims = list(t.shape) if t.dim() <= _MAX_DIMS else [-2] * _MAX_DIMS
    code = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
    return [t.dim(), code, *dims, *([-1] * (_MAX_DIMS - len(dims)))]


def _describe(row: list[int]) -> str:
    ndim, code, dims = row[0], row[1], row[2:2 + max(0, min(row[0], _MAX_DIMS))]
    dtype = str(_DTYPES[code]).replace("torch.", "") if code >= 0 else "other dtype"
    return f"{list(dims)} {dtype}" if ndim <= _MAX_DIMS else f"{ndim}-d {dtype}"


def agree(group=None, seq_dim: int = 2, **tensors: torch.Tensor) -> dict[str, list[tuple]]:
    """Check that every rank passes tensors of one dtype and shape except along `seq_dim`.

    One all-gather of a few int64 per tensor. Returns {name: [shape on rank 0, rank 1, ...]}, so
    callers learn every rank's shard length. Raises the same InputError on every rank when the
    ranks disagree (the alternative is a hang or a gloo abort deep inside the first collective).
    """
    rank, world = require_group(group, "this collective")
    names = list(tensors)
    local = [x for name in names for x in _encode(tensors[name])]
    width = len(local)
    mine = torch.tensor(local, dtype=torch.int64, device=comm_device(group))
    gathered = torch.empty(world * width, dtype=torch.int64, device=mine.device)
    with tracked("all_gather (shape/dtype agreement)", group=group):
        all_gather_single(gathered, mine, group=group)
    rows = gathered.view(world, width).tolist()
    n = width // len(names)
    result: dict[str, list[tuple]] = {}
    for i, name in enumerate(names):
        per_rank = [row[i * n:(i + 1) * n] for row in rows]
        ref = per_rank[0]
        for r, row in enumerate(per_rank):
            same = row[:2] == ref[:2] and all(
                a == b for d, (a, b) in enumerate(zip(row[2:], ref[2:], strict=True))
                if d != seq_dim)
            if not same:
                raise InputError(
                    f"{name} differs across ranks: rank 0 has {_describe(ref)}, rank {r} has "
                    f"{_describe(row)}; every rank must pass the same dtype and shape except "
                    f"the sequence dim {seq_dim} (this is rank {rank})")
        result[name] = [tuple(row[2:2 + row[0]]) for row in per_rank]
    return result


def agree_settings(group, what: str, **settings) -> None:
    """Raise the same InputError on every rank of `group` unless every rank passes the same
    `settings` (compared by repr). Ranks that disagree on a method or a model's shape otherwise
    part ways in their first collective: a timeout with no diagnosis, or a gloo abort."""
    rank, world = require_group(group, what)
    if world == 1:
        return
    mine = {name: repr(value) for name, value in settings.items()}
    every: list = [None] * world
    with tracked(f"all_gather_object ({what} agreement)", group=group):
        dist.all_gather_object(every, mine, group=group)
    differ = [f"{name} (rank 0 has {every[0][name]}, rank {r} has {row[name]})"
              for name in mine for r, row in enumerate(every) if row[name] != every[0][name]]
    if differ:
        raise InputError(f"{what}: every rank must pass the same settings, and they differ in "
                         f"{'; '.join(differ[:4])} (this is rank {rank})")


def all_gather_single(output: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """Gather equal-sized `tensor`s of every rank into `output` (rank-major), across torch versions.

    torch 2.13 renamed all_gather_into_tensor to all_gather_single (the old name warns).
    """
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(output.view(-1), tensor.reshape(-1), group=group)  # flat: dim 0 then splits by rank


def reduce_scatter_single(output: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """Sum `tensor` over every rank and keep this rank's slice of dim 0 in `output`, across torch
    versions (torch 2.13 renamed reduce_scatter_tensor to reduce_scatter_single).

    tensor `[P * n, ...]` on every rank; output `[n, ...]`: rows rank * n .. (rank + 1) * n - 1
    of the sum.
    """
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(output.view(-1), tensor.reshape(-1), group=group)  # flat: dim 0 splits by rank


# --- heartbeat: which communication call each rank is in ----------------------------------------

class _Heartbeat:
    """One small file per rank, rewritten on entry to and exit from each tracked call.

    The file is memory-mapped at a fixed size and each record is copied into the map, space
    padded (JSON ignores the trailing spaces): no system call per write. A ring call writes
    six records and a model makes thousands of ring calls per sample, so the ftruncate and
    pwrite it replaces cost 0.3 ms per ring call (`cpcourse bench ring --small`).
    """

    SIZE = 4096

    def __init__(self):
        self.map = None
        self.key = None
        self.current: dict = {}

    def _open(self, run_dir: str):
        path = os.path.join(run_dir, f"rank{os.environ.get('RANK', '0')}.op")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, self.SIZE)
            return mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)  # the map keeps the file open

    def write(self, record: dict) -> None:
        self.current = record
        run_dir = os.environ.get(ENV_RUN_DIR)
        if not run_dir:
            return
        key = (os.getpid(), run_dir)  # a forked child or another run gets its own file
        if key != self.key:
            self.map, self.key = self._open(run_dir), key
        data = json.dumps(record).encode()
        if len(data) > self.SIZE:  # an absurdly long label: keep the record valid JSON
            data = json.dumps({**record, "op": str(record.get("op"))[:1000]}).encode()
        self.map[:] = data.ljust(self.SIZE)


_HEARTBEAT = _Heartbeat()


@contextlib.contextmanager
def tracked(op: str, group=None, **details):
    """Record that this rank is inside communication call `op` until the block exits.

    `details` (peer ranks, ring step, bytes) are shown by the launcher if the call never returns.
    """
    label = op + (" (" + ", ".join(f"{k}={v}" for k, v in details.items()) + ")"
                  if details else "")
    _HEARTBEAT.write({"op": label, "since": time.time()})
    try:
        yield
    except BaseException:
        _HEARTBEAT.write({"op": None, "failed_in": label, "since": time.time()})
        raise
    _HEARTBEAT.write({"op": None, "last": label, "since": time.time()})
