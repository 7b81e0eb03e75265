"""Block-causal attention and the KV cache's designs measured on P ranks, in one launch.

    python -c "from cpcourse.runs.causal_cp import run_causal; print(run_causal(4)['schemes'])"

`run(CausalRequest(nproc=4, ...))` (or `run_causal(4, ...)`) draws seeded q, k, v for a clip
of `frames` frames of `tokens_per_frame` tokens, cut into chunks of `chunk` frames, and on
`nproc` ranks (gloo):
- runs `cpcourse.causal.block_causal_attention_cp` for every chunk assignment and both methods
  (the skipping ring, the all-to-all), each rank's error against one process's float64 masked
  attention, its score-matrix work, and the bytes it sent measured on the wire, split by the
  ring into useful and wasted (K/V blocks a rank received and did not need);
- streams the same clip chunk after chunk through a `cpcourse.causal.KVCacheCP` of each design
  that fits the heads, and measures the bytes each new chunk moved and the cache each rank
  holds, against the history.
What notebook 14 shows; tests/dist/test_causal_cp.py checks the same library on harder cases.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from cpcourse.launch import launch
from cpcourse.support.errors import require
from cpcourse.support.request import check_common, flag


@dataclass(frozen=True)
class CausalRequest:
    """One measurement of block-causal CP and the KV cache's designs, checked."""

    nproc: int = flag(4, "ranks")
    frames: int = flag(8, "frames in the clip")
    chunk: int = flag(1, "frames per chunk (the causal unit)")
    tokens_per_frame: int = flag(4, "tokens in one frame")
    heads: int = flag(4, "attention heads")
    head_dim: int = flag(8, "channels per head")
    seed: int = flag(0, "seed of q, k, v")
    timeout: float = flag(120.0, "seconds the ranks may run")

    def __post_init__(self):
        check_common(self, whole=("frames", "chunk", "tokens_per_frame", "heads", "head_dim"))
        require(self.chunk <= self.frames,
                f"a chunk of {self.chunk} frames is longer than the clip ({self.frames})")


def _clip(req: CausalRequest):
    """q, k, v [1, H, frames x tokens_per_frame, D] (float64), each token's chunk, the mask."""
    from cpcourse.causal import block_causal_mask, chunk_of_frames

    gen = torch.Generator().manual_seed(req.seed)
    frames, chunk, tpf = req.frames, req.chunk, req.tokens_per_frame
    q, k, v = (torch.randn(1, req.heads, frames * tpf, req.head_dim, generator=gen,
                           dtype=torch.float64) for _ in range(3))
    return q, k, v, chunk_of_frames(frames, chunk, tpf), block_causal_mask(frames, chunk, tpf)


def _schemes(req: CausalRequest, rank, world):
    from cpcourse import causal
    from cpcourse.support.bytecount import count_bytes

    q, k, v, layout, mask = _clip(req)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    sizes, rows = causal.chunk_sizes(layout), []
    for scheme in causal.SCHEMES:
        idx = causal.rank_tokens(layout, causal.assign_chunks(len(sizes), world, scheme, sizes),
                                 rank)
        mine = [x[:, :, idx].float() for x in (q, k, v)]
        for method in causal.METHODS:
            stats = []
            with count_bytes() as sent:
                out = causal.block_causal_attention_cp(*mine, layout, scheme=scheme,
                                                       method=method, stats=stats)
            err = (out.double() - want[:, :, idx]).abs()
            rows.append({"scheme": scheme, "method": method, "sent_bytes": sent.total,
                         "max_abs_err": float(err.max()) if err.numel() else 0.0, **stats[0]})
    return rows


def _streams(req: CausalRequest, rank, world):
    from cpcourse.attention import reference_attention
    from cpcourse.causal import DESIGNS, KVCacheCP
    from cpcourse.support.bytecount import count_bytes

    q, k, v, layout, _ = _clip(req)
    out = {}
    for design in DESIGNS:
        if design == "ulysses" and req.heads % world:
            continue
        cache, rows = KVCacheCP(design), []
        for c in range(int(layout.max()) + 1):
            new = (layout == c).nonzero().flatten()
            end = int(new[-1]) + 1
            # [1, H, chunk tokens / P, D]: this rank's share of the new chunk
            mine = [x[:, :, new].tensor_split(world, dim=2)[rank].float() for x in (q, k, v)]
            with count_bytes() as sent:
                cache.append(mine[1], mine[2])
                got = cache.attend(mine[0])
            want, _ = reference_attention(q[:, :, new], k[:, :, :end], v[:, :, :end])
            err = (got.double() - want.tensor_split(world, dim=2)[rank]).abs()
            rows.append({"history": c, "sent_bytes": sent.total,
                         "cache_bytes": cache.cache_bytes,
                         "max_abs_err": float(err.max()) if err.numel() else 0.0})
        out[design] = rows
    return out


def rank_causal(req: CausalRequest) -> dict:
    """Runs on every rank: every assignment x method, then every cache design's stream."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    return {"schemes": _schemes(req, rank, world), "streams": _streams(req, rank, world)}


def _summed(per_rank: list[dict]) -> dict:
    """The ranks' rows joined: per scheme and method the worst error, the work of each rank and
    the bytes summed; per design and chunk the bytes summed and the largest cache."""
    schemes = []
    for i, row in enumerate(per_rank[0]["schemes"]):
        rows = [res["schemes"][i] for res in per_rank]
        schemes.append({"scheme": row["scheme"], "method": row["method"],
                        "max_abs_err": max(r["max_abs_err"] for r in rows),
                        "work_per_rank": [r["work"] for r in rows],
                        **{key: sum(r[key] for r in rows)
                           for key in ("sent_bytes", "useful_bytes", "wasted_bytes")}})
    streams = {design: [{"history": c, "max_abs_err": max(res["streams"][design][c]["max_abs_err"]
                                                          for res in per_rank),
                         "sent_bytes": sum(res["streams"][design][c]["sent_bytes"]
                                           for res in per_rank),
                         "cache_bytes_per_rank": max(res["streams"][design][c]["cache_bytes"]
                                                     for res in per_rank)}
                        for c in range(len(rows))]
               for design, rows in per_rank[0]["streams"].items()}
    return {"schemes": schemes, "streams": streams}


def run(req: CausalRequest) -> dict:
    """Launch `rank_causal` on `req.nproc` ranks; the joined report (see `_summed`)."""
    per_rank = launch(rank_causal, req.nproc, timeout=req.timeout, args=(req,), stream=False,
                      threads=1)
    spec = {k: v for k, v in asdict(req).items() if k not in ("nproc", "timeout")}
    return {"spec": spec, "world": req.nproc, **_summed(per_rank)}


def run_causal(nproc: int, *, frames: int = 8, chunk: int = 1, tokens_per_frame: int = 4,
               heads: int = 4, head_dim: int = 8, seed: int = 0, timeout: float = 120) -> dict:
    """`run(CausalRequest(...))` with its fields as arguments (what notebook 14 calls)."""
    return run(CausalRequest(nproc=nproc, frames=frames, chunk=chunk, heads=heads,
                             tokens_per_frame=tokens_per_frame, head_dim=head_dim, seed=seed,
                             timeout=timeout))
