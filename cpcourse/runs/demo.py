"""Ring attention on P local processes, checked against one-process attention: `cpcourse demo`.

    cpcourse demo --nproc 3 --seq-len 1000 --json

`run(DemoRequest(nproc=3, seq_len=1000))`: every rank builds the same seeded q, k, v
`[B, H, L, D]` (`inputs`), keeps its shard (tensor_split order) and runs
`cpcourse.ring.ring_attention` (`rank`); the ranks send back their output shards and per-step
timings. This process then runs one fused attention over the whole sequence, compares, and
reports the error against the dtype's tolerance, the times and each ring step's records.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from cpcourse.support.dtypes import TORCH_NAMES
from cpcourse.support.peak_memory import require_fits
from cpcourse.support.request import check_common, flag

DTYPES = ("fp32", "bf16", "fp16")
MODES = ("overlap", "blocking", "allgather")
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3}  # max |ring - fused|


@dataclass(frozen=True)
class DemoRequest:
    """One ring run, checked: the fields are `cpcourse demo`'s flags (one declaration)."""

    nproc: int = flag(4, "local processes (ranks)")
    seq_len: int = flag(4096, "whole sequence length L")
    heads: int = flag(8, "heads H")
    head_dim: int = flag(64, "channels per head D")
    batch: int = flag(1, "batch B")
    dtype: str = flag("fp32", "q, k, v's dtype", choices=sorted(DTYPES))
    mode: str = flag("overlap", "the ring overlapped, blocking, or one all-gather",
                     choices=MODES)
    seed: int = flag(0, "q, k, v seed")
    timeout: float = flag(120.0, "seconds for the ring run")

    def __post_init__(self):
        check_common(self, whole=("seq_len", "heads", "head_dim", "batch"))
        # Every rank builds the whole q, k, v and keeps its output; the checker holds the same
        elems = self.batch * self.heads * self.seq_len * self.head_dim
        require_fits((self.nproc + 1) * 4 * elems * 4, f"seq_len {self.seq_len} on "
                     f"{self.nproc} ranks", "use a smaller `seq_len`, `heads` or `nproc`")

    @property
    def torch_dtype(self) -> str:
        """torch's name of `dtype` ("float32" for "fp32")."""
        return TORCH_NAMES[self.dtype]


def inputs(req: DemoRequest):
    """The whole q, k, v `[B, H, L, D]` every rank and the checker build from the same seed."""
    import torch

    g = torch.Generator().manual_seed(req.seed)
    shape = (req.batch, req.heads, req.seq_len, req.head_dim)
    return [torch.randn(shape, generator=g).to(getattr(torch, req.torch_dtype))
            for _ in range(3)]


def rank(req: DemoRequest) -> dict:
    """What each rank runs: a warm-up call, then the timed ring with per-step stats."""
    import torch.distributed as dist

    from cpcourse.ring import ring_attention
    from cpcourse.support.shards import shard

    r, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard(x, r, world) for x in inputs(req))  # [B, H, L/P, D] each
    ring_attention(q, k, v, mode=req.mode)  # warm-up: thread pools, first-touch pages
    dist.barrier()
    stats = []
    start = time.perf_counter()
    out = ring_attention(q, k, v, mode=req.mode, stats=stats)
    return {"out": out, "seconds": time.perf_counter() - start, "stats": stats}


def _to_stderr(line: str) -> None:
    """Rank output goes to stderr: stdout carries only the report (one JSON object with --json)."""
    print(line, end="", file=sys.stderr, flush=True)


def run(req: DemoRequest) -> dict:
    """Launch the ring, check it against fused attention here; returns the report dict."""
    import torch

    from cpcourse.attention import attention_with_lse
    from cpcourse.launch import launch

    t0 = time.perf_counter()
    # by name, so a test (or a user) may swap `rank` in this module under torchrun
    results = launch("cpcourse.runs.demo:rank", req.nproc, timeout=req.timeout, args=(req,),
                     threads=1, stream=_to_stderr)
    launch_s = time.perf_counter() - t0
    q, k, v = inputs(req)
    want, _ = attention_with_lse(q, k, v)  # the check; the second call is the timed one
    t1 = time.perf_counter()
    attention_with_lse(q, k, v)
    fused_s = time.perf_counter() - t1
    got = torch.cat([r["out"] for r in results], dim=2)  # [B, H, L, D]
    err = float((got.double() - want.double()).abs().max())
    tol = TOLERANCE[req.torch_dtype]
    return {"nproc": req.nproc, "seq_len": req.seq_len, "heads": req.heads,
            "head_dim": req.head_dim, "batch": req.batch, "dtype": req.torch_dtype,
            "mode": req.mode, "backend": "gloo", "threads_per_rank": 1,
            "max_abs_err": err, "tolerance": tol, "ok": err <= tol,
            "ring_seconds": max(r["seconds"] for r in results),
            "fused_seconds": fused_s, "fused_threads": torch.get_num_threads(),
            "launch_seconds": launch_s, "steps": [s for r in results for s in r["stats"]]}
