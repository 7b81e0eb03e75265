"""Sparse attention on P ranks against the dense masked reference: `cpcourse sparse`.

    cpcourse sparse --nproc 4 --method ring --mask radial --balance greedy --compare --json

`SparseRequest` holds one run's parameters and checks them when built (nothing starts on bad
input); `rank(req)` runs on every rank: seeded q, k, v `[1, heads, L, head_dim]` over a
frames x height x width token grid, the block mask (top-k from all-reduced tile means), the
assignment (`balance`), then `ulysses_sparse` or `ring_sparse`; `run(req)` launches the ranks,
puts the output back together and, with `compare`, checks it against `masked_attention` in
float64 on the same inputs. Work is score entries computed per rank; bytes are what each rank
sent (`dense_bytes_per_rank`: the same collective with no block skipped, in the run's dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cpcourse.fp8_comm import COMM_DTYPES, Codec, calibrated_scale
from cpcourse.launch import launch
from cpcourse.sparse import (
    BlockMask,
    masked_attention,
    radial_mask,
    sliding_tile_mask,
    tile_counts,
    topk_from_pooled,
    topk_mask,
)
from cpcourse.sparse.cp import (
    BALANCES,
    heads_of_ranks,
    imbalance,
    pooled_cp,
    predicted_work,
    ring_sparse,
    tokens_of_ranks,
    ulysses_sparse,
)
from cpcourse.support.errors import require
from cpcourse.support.request import check_common, flag
from cpcourse.support.shards import shard_sizes
from cpcourse.support.tolerance import tolerance

METHODS = ("ulysses", "ring")
MASKS = ("tile", "radial", "topk")
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class SparseRequest:
    """One `cpcourse sparse` run. Grid sizes are in tokens; `tile` and `window` are
    (frames, rows, cols) in tokens; heads must split over nproc for Ulysses."""

    nproc: int = flag(2, "ranks")
    method: str = flag("ulysses", "ulysses (heads local) or the skipping ring", choices=METHODS)
    mask: str = flag("radial", "tile (a sliding 3-D window), radial or topk", choices=MASKS)
    balance: str = flag("none", "deal heads (ulysses) or query tiles (ring) by kept work "
                        "(greedy)", choices=BALANCES)
    frames: int = flag(8, "token grid frames")
    height: int = flag(8, "token grid rows")
    width: int = flag(8, "token grid cols")
    seed: int = flag(0, "q, k, v seed")
    heads: int = flag(12, "attention heads")
    head_dim: int = flag(8, "channels per head", cli=False)
    tile: tuple = flag((1, 4, 4), "a block's (frames, rows, cols) in tokens", cli=False)
    window: tuple = flag((3, 8, 8), "the tile mask's reach in tokens", cli=False)
    dtype: str = flag("float32", "q, k, v and the attention's dtype", choices=DTYPES)
    comm_dtype: str = flag("fp32", "how K/V travel: fp32 (exact), bf16, fp8 (per token-and-head "
                           "scales), fp8-tensor (one calibrated scale)", choices=COMM_DTYPES)
    timeout: float = flag(120.0, "seconds the ranks may run")

    def __post_init__(self):
        check_common(self, whole=("frames", "height", "width", "heads", "head_dim"))
        length = self.frames * self.height * self.width
        require(length <= 4096, f"frames x height x width = {length} tokens: use at most 4096 "
                "(the reference materialises L x L scores per head)")
        require(self.nproc <= length, f"nproc {self.nproc} is more ranks than the {length} "
                "tokens")
        require(self.method == "ring" or self.heads % self.nproc == 0, f"heads {self.heads} do "
                f"not split over nproc {self.nproc}: Ulysses gives each rank heads/P heads")
        n = math.prod(tile_counts(self.grid, self.tile))
        require(self.balance == "none" or self.method == "ulysses" or n >= self.nproc,
                f"balance greedy deals whole tiles: {n} tiles for nproc {self.nproc}")

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.frames, self.height, self.width)

    def keep(self) -> list[int]:
        """top-k: head h keeps 1 + h (n - 1) / (heads - 1) key tiles (1 .. n): densities differ."""
        n = math.prod(tile_counts(self.grid, self.tile))
        return [1 + (h * (n - 1)) // max(1, self.heads - 1) for h in range(self.heads)]


def inputs(req: SparseRequest):
    """Seeded q, k, v `[1, heads, L, head_dim]` in req.dtype (drawn in float64, then rounded)."""
    g = torch.Generator().manual_seed(req.seed)
    length = math.prod(req.grid)
    return [torch.randn(1, req.heads, length, req.head_dim, generator=g,
                        dtype=torch.float64).to(getattr(torch, req.dtype)) for _ in range(3)]


def static_mask(req: SparseRequest, q=None, k=None) -> BlockMask:
    """The mask one process would use (top-k from the whole q, k)."""
    if req.mask == "tile":
        mask = sliding_tile_mask(req.grid, req.tile, req.window, req.heads)
    elif req.mask == "radial":
        mask = radial_mask(req.grid, req.tile, req.heads)
    else:
        mask = topk_mask(q, k, req.grid, req.tile, req.keep())
    return BlockMask(mask, req.grid, req.tile)


def rank(req: SparseRequest) -> dict:
    """On each rank: its shard of q, k, v, the mask, the method. Returns its out shard, token
    ids, stats, and (rank 0) the mask."""
    import torch.distributed as dist

    r, world = dist.get_rank(), dist.get_world_size()
    q, k, v = inputs(req)  # [1, H, L, D] each, the whole sequence on every rank
    first = torch.tensor_split(torch.arange(q.shape[2]), world)[r]   # contiguous shard: L/P ids
    if req.mask == "topk":  # tile means all-reduced: every rank derives the same mask
        # q[:, :, first] [1, H, L/P, D] -> the whole sequence's tile means [H, n tiles, D]
        bm = BlockMask(topk_from_pooled(pooled_cp(q[:, :, first], first, req.grid, req.tile),
                                        pooled_cp(k[:, :, first], first, req.grid, req.tile),
                                        req.keep()), req.grid, req.tile)
    else:
        bm = static_mask(req)
    codec = Codec(req.comm_dtype, _calibrate(q, k, v) if req.comm_dtype == "fp8-tensor"
                  else None)
    stats: dict = {}
    if req.method == "ulysses":
        heads = heads_of_ranks(bm, world, req.balance)
        # this rank's run of tokens [1, H, L/P, D] in, its out [1, H, L/P, D]
        out = ulysses_sparse(q[:, :, first], k[:, :, first], v[:, :, first], bm, heads=heads,
                             codec=codec, stats=stats)
        ids, assignment = first, heads
    else:
        tokens = tokens_of_ranks(bm, world, req.balance)
        ids, assignment = tokens[r], tokens
        # this rank's tokens `ids` (contiguous or dealt): [1, H, L_r, D] in and out
        out = ring_sparse(q[:, :, ids], k[:, :, ids], v[:, :, ids], bm, tokens, codec=codec,
                          stats=stats)
    predicted = predicted_work(bm, req.method, assignment)
    return {"out": out, "ids": ids, "stats": stats, "predicted_work": predicted[r],
            "unbalanced_work": predicted_work(
                bm, req.method, heads_of_ranks(bm, world) if req.method == "ulysses"
                else tokens_of_ranks(bm, world))[r],
            "mask": bm if r == 0 else None}


def _calibrate(q, k, v) -> float:
    """The per-tensor fp8 scale, calibrated once: the largest |q|, |k|, |v| over every rank
    (out, an average of v's rows, never exceeds max |v|)."""
    import torch.distributed as dist

    amax = torch.stack([x.abs().amax() for x in (q, k, v)]).amax().float().reshape(1)  # [1]
    dist.all_reduce(amax, op=dist.ReduceOp.MAX)
    return calibrated_scale(float(amax))


def rank_cases(reqs: list) -> list[dict]:
    """Several requests in one launch (the dist tests): each rank's result for each."""
    return [rank(req) for req in reqs]


def report(req: SparseRequest, results: list[dict], compare: bool = True) -> dict:
    """The run's JSON report from every rank's result."""
    q, k, v = inputs(req)
    out = torch.empty_like(q)
    for res in results:
        out[:, :, res["ids"]] = res["out"]
    stats = [res["stats"] for res in results]
    work = [s["work"] for s in stats]
    blocks = sum(s["blocks"] for s in stats)
    skipped = sum(s["skipped"] for s in stats)
    rep = {"nproc": req.nproc, "method": req.method, "mask": req.mask, "balance": req.balance,
           "grid": list(req.grid), "tile": list(req.tile), "heads": req.heads,
           "dtype": req.dtype, "comm_dtype": req.comm_dtype, "work_per_rank": work,
           "imbalance": imbalance(work),
           "imbalance_unbalanced": imbalance([res["unbalanced_work"] for res in results]),
           "density": float(results[0]["mask"].mask.double().mean()),
           "bytes_per_rank": [int(s["bytes_sent"]) for s in stats],
           "dense_bytes_per_rank": [int(s["dense_bytes"]) for s in stats],
           "skipped_fraction": skipped / max(1, blocks + skipped),
           "seconds": max(s["seconds"] for s in stats),
           "tokens_per_rank": [len(res["ids"]) for res in results]
           if req.method == "ring" else shard_sizes(q.shape[2], req.nproc)}
    if compare:
        bm = results[0]["mask"]
        want, _ = masked_attention(q.double(), k.double(), v.double(), bm)
        err = float((out.double() - want).abs().max())
        # block-sparse sums its kept keys tile by tile, and the ring merges partial softmaxes:
        # rounding in another order than one dense softmax, the merge class of the one rule
        tol = tolerance("sparse", req.dtype, scale=float(want.abs().max()))
        exact = req.comm_dtype == "fp32"
        rep.update(max_abs_err=err, tolerance=tol, within_tolerance=err <= tol, exact=exact,
                   mask_matches_one_process=bool(torch.equal(bm.mask, static_mask(req, q, k).mask)))
        if not exact:
            rep["why"] = f"K/V{', q and out' if req.method == 'ulysses' else ''} sent as " \
                         f"{req.comm_dtype}: rounded on the wire"
    return rep


def run(req: SparseRequest, compare: bool = True, stream=False) -> dict:
    """Launch req.nproc ranks and report (see `report`)."""
    results = launch("cpcourse.runs.sparse:rank", req.nproc, timeout=req.timeout, args=(req,),
                     stream=stream, threads=1)
    return report(req, list(results), compare)
