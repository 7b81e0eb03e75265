"""The tiny video DiT trained on P ranks (CP, and data parallel beside it) against one process.

    cpcourse train --nproc 2 --cp ring --steps 3 --seed 0 --compare --json

`run(TrainCPRequest(...))` launches `rank(req)` on `req.nproc` ranks: dp replicas of sp = nproc
/ dp ranks each; a replica takes its slice of the batch (tensor_split order), its sp ranks split
the frames after patchify (`cpcourse.cp_boundaries.scatter_sequence`), run the model with full
3D attention by the ring or Ulysses (both differentiable), gather the prediction before the loss
(`gather_sequence`), weigh their loss so the dp x sp losses add up to one process's, and sum
every parameter gradient over all ranks. Every rank and the one-process run draw the same
batches from one seeded generator, start from the same seeded weights and take the same SGD
steps, so with `compare` the weights after the last step must agree within
`cpcourse.support.tolerance.training_tolerance`. `checkpoint` recomputes each block in the
backward (activation checkpointing). Each rank's bytes are measured over step 0
(`cpcourse.support.peak_memory.StorageTracker`): the peak of its forward + backward, and the
activations (alive when the model's forward returns), set beside a prediction from one
process's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from cpcourse.launch import launch
from cpcourse.support.errors import positive_int, require, seed_int
from cpcourse.support.request import check_nproc, flag
from cpcourse.support.shards import shard_offsets, shard_sizes
from cpcourse.support.tolerance import training_tolerance

METHODS = ("ring", "ulysses")
LR, MOMENTUM = 0.05, 0.9  # SGD: an update linear in the gradient (training_tolerance says why)


@dataclass(frozen=True)
class TrainCPRequest:
    """One comparison run: `nproc` ranks = `dp` replicas x sp CP ranks, `batch` clips of
    `frames` frames per step (the whole batch, over every replica)."""

    nproc: int = flag(2, "train under CP on P local processes (a smaller model; no --out)")
    cp: str = flag("ring", "the attention's CP method", choices=METHODS, acts="cp")
    dp: int = flag(1, "data-parallel replicas, each of nproc / dp CP ranks", acts="cp")
    steps: int = flag(3, "SGD steps")
    seed: int = flag(0, "data, noise and init seed")
    batch: int = flag(4, "clips per step, over every replica", cli=False)
    frames: int = flag(8, "frames per clip", cli=False)
    compare: bool = flag(True, "train in one process too and compare the weights", acts="cp")
    checkpoint: bool = flag(False, "recompute each block in the backward", acts="cp")

    def __post_init__(self):
        check_nproc(self.nproc, "--nproc")
        require(self.cp in METHODS, f"--cp must be one of {', '.join(METHODS)}, got {self.cp!r}")
        positive_int("--dp", self.dp)
        require(self.nproc % self.dp == 0, f"--dp {self.dp} must divide --nproc {self.nproc} "
                f"(dp replicas of nproc / dp CP ranks)")
        positive_int("--steps", self.steps)
        require(self.steps <= 1000, f"--steps {self.steps}: use at most 1000 (a CPU run)")
        seed_int("--seed", self.seed)
        require(self.dp <= self.batch, f"--dp {self.dp} is more replicas than the batch's "
                f"{self.batch} clips")
        require(self.sp <= self.frames, f"{self.sp} CP ranks for {self.frames} frames: use at "
                f"most {self.frames} ranks per replica")
        heads = model_config().heads
        require(self.cp != "ulysses" or heads % self.sp == 0,
                f"--cp ulysses splits the {heads} heads over {self.sp} ranks: use --nproc / --dp "
                f"in {[p for p in range(1, heads + 1) if heads % p == 0]}, or --cp ring")

    @property
    def sp(self) -> int:
        return self.nproc // self.dp


def model_config():
    """The shapes model's architecture, smaller: full 3D attention, so CP carries the gradient
    of every token pair; 4 heads, so Ulysses runs on 1, 2 or 4 ranks."""
    from cpcourse.tinydit.model import DiTConfig
    from cpcourse.tinydit.moving_shapes import DIRECTIONS, SHAPES

    return DiTConfig(in_channels=3, patch=8, hidden=32, heads=4, depth=2, mlp_ratio=2,
                     num_classes=len(SHAPES), num_motions=len(DIRECTIONS), attention="full",
                     prediction="sample", frame_embed=True)


def _forward(model, tokens, t, y, ctx, checkpoint: bool):
    """The model's forward, each block recomputed in the backward when `checkpoint`: only the
    blocks' inputs stay alive between the passes (the ring and the all-to-alls run again)."""
    from torch.utils.checkpoint import checkpoint as recompute

    x, c = model.embed_inputs(tokens, t, y, ctx)  # x [B, T_r, S, hidden], c [B, hidden]
    for block in model.blocks:
        x = recompute(block, x, c, ctx, use_reentrant=False) if checkpoint else block(x, c, ctx)
    return model.final_layer(x, c)  # [B, T_r, S, 3*p*p]


def _layout(req: TrainCPRequest | None):
    """(dp index, sp index, the sp group, the world group) of this rank; one process: Nones."""
    if req is None:
        return 0, 0, None, None
    import torch.distributed as dist

    rank = dist.get_rank()
    sp_group = dist.group.WORLD  # not None: to the model, None means "one process"
    if req.dp > 1:  # every rank creates every group, in the same order
        for d in range(req.dp):
            g = dist.new_group(list(range(d * req.sp, (d + 1) * req.sp)))
            sp_group = g if d == rank // req.sp else sp_group
    return rank // req.sp, rank % req.sp, sp_group, dist.group.WORLD


def _local_batch(batch, req: TrainCPRequest | None, where) -> tuple:
    """This rank's part of the batch: its replica's clips (views), its frames of their tokens
    (`scatter_sequence`, after patchify, copied dense: the rank's input, like one process's
    whole batch), their times, labels and the replica's whole target."""
    from cpcourse.cp_boundaries import scatter_sequence

    if req is None:
        return batch
    xt, t, y, target, grid = batch
    d, _, sp_group, _ = where
    # this replica's samples: xt and target [B/dp, T, S, 3*p*p], t [B/dp], y [B/dp, 2]
    xt, t, y, target = (torch.tensor_split(x, req.dp)[d] for x in (xt, t, y, target))
    # xt -> this rank's frames [B/dp, T/sp, S, 3*p*p]; the target stays whole
    return scatter_sequence(xt, dim=1, group=sp_group).contiguous(), t, y, target, grid


def _step(model, local, req: TrainCPRequest | None, where, checkpoint: bool,
          mark=lambda: None):
    """One forward: this rank's weighted loss (its gradients summed over ranks are one
    process's). `where`: `_layout`'s; one process when req is None. `mark()` is called when
    the model's forward is done (what is alive then is what the backward needs)."""
    from cpcourse.cp_boundaries import gather_sequence, loss_weight
    from cpcourse.tinydit.model import CPContext

    tokens, t, y, target, grid = local
    if req is None:
        pred = _forward(model, tokens, t, y, CPContext(grid=grid), checkpoint)
        mark()
        return ((pred - target) ** 2).sum() / target.numel()
    _, s, sp_group, _ = where
    offset = shard_offsets(shard_sizes(req.frames, req.sp))[s]
    ctx = CPContext(group=sp_group, frame_offset=offset, grid=grid, full_method=req.cp)
    pred = _forward(model, tokens, t, y, ctx, checkpoint)
    mark()
    # [B/dp, T/sp, S, 3*p*p] -> [B/dp, T, S, 3*p*p]: the whole sequence before the loss
    full = gather_sequence(pred, dim=1, group=sp_group)
    per_sample = target[0].numel() if len(target) else 0
    return ((full - target) ** 2).sum() * loss_weight(req.batch, per_sample, req.sp)


def train(req: TrainCPRequest, cp: bool) -> dict:
    """The training loop, the same on every rank (cp=True, under a launch) and in one process:
    {"loss" per step, "weights" (the final state dict), "peak_bytes" of step 0's forward +
    backward, "activation_bytes" (alive when step 0's model forward returns: what the backward
    keeps), "max_grad" (the largest |gradient| after clipping)}."""
    import torch.distributed as dist

    from cpcourse.cp_boundaries import all_reduce_grads
    from cpcourse.support.peak_memory import StorageTracker
    from cpcourse.tinydit.model import build_model
    from cpcourse.tinydit.moving_shapes import random_clips
    from cpcourse.tinydit.training import training_batch

    model = build_model(model_config(), req.seed).train()  # seeded: the same on every rank
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    gen = torch.Generator().manual_seed(req.seed)
    where = _layout(req if cp else None)
    losses, marks, max_grad, tracker = [], [], 0.0, StorageTracker()
    for step in range(req.steps):
        batch = training_batch(model.cfg, *random_clips(req.batch, gen, frames=req.frames), gen)
        local = _local_batch(batch, req if cp else None, where)
        opt.zero_grad(set_to_none=True)
        if step == 0:  # measured once: the tracker sees every operator (slow, exact)
            with tracker:
                loss = _step(model, local, req if cp else None, where, req.checkpoint,
                             lambda: marks.append(tracker.current_bytes))
                loss.backward()
        else:
            loss = _step(model, local, req if cp else None, where, req.checkpoint)
            loss.backward()
        loss = loss.detach()
        if cp:
            all_reduce_grads(params)
            dist.all_reduce(loss)  # the dp x sp terms add up to one process's loss
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        max_grad = max(max_grad, max(float(p.grad.abs().max()) for p in params))
        opt.step()
        losses.append(float(loss))
    return {"loss": losses, "weights": {k: v.detach().clone() for k, v in
                                        model.state_dict().items()},
            "peak_bytes": int(tracker.peak_bytes), "activation_bytes": int(marks[0]),
            "max_grad": max_grad}


def rank(req: TrainCPRequest) -> dict:
    """One rank's run; rank 0 returns the weights (every rank's are the same)."""
    import torch.distributed as dist

    res = train(req, cp=True)
    if dist.get_rank():
        res["weights"] = None
    return res


def predicted_activations(single: int, req: TrainCPRequest) -> int:
    """A rank's activation bytes from one process's: every saved activation is per token (the
    ring and flash attention alike save q, k, v, out and lse, O(L)), so they scale with the
    tokens the rank holds: its batch slice x its frames (the largest shard)."""
    share = (-(-req.batch // req.dp) * -(-req.frames // req.sp)) / (req.batch * req.frames)
    return int(single * share)


def run(req: TrainCPRequest, timeout: float = 600.0) -> dict:
    """Train on `req.nproc` ranks (and, with `req.compare`, in this process); the report."""
    t0 = time.perf_counter()
    results = launch("cpcourse.runs.train_cp:rank", req.nproc, timeout=timeout, args=(req,),
                     stream=False, threads=1)
    seconds = time.perf_counter() - t0
    report = {"nproc": req.nproc, "cp": req.cp, "dp": req.dp, "sp": req.sp, "steps": req.steps,
              "seed": req.seed, "batch": req.batch, "frames": req.frames,
              "checkpoint": req.checkpoint, "optimizer": f"SGD lr {LR} momentum {MOMENTUM}",
              "loss": {"cp": results[0]["loss"]},
              "peak_bytes_per_rank": [r["peak_bytes"] for r in results],
              "activation_bytes_per_rank": [r["activation_bytes"] for r in results],
              "seconds": round(seconds, 2)}
    if req.compare:
        single = train(req, cp=False)
        err = max(float((results[0]["weights"][k] - w).abs().max())
                  for k, w in single["weights"].items())
        tol = training_tolerance(req.steps, LR, MOMENTUM, grad_scale=single["max_grad"])
        report.update({"loss": {**report["loss"], "single": single["loss"]},
                       "max_weight_err": err, "tolerance": tol,
                       "within_tolerance": bool(err <= tol),
                       "peak_bytes_single": single["peak_bytes"],
                       "activation_bytes_single": single["activation_bytes"],
                       "predicted_activation_bytes_per_rank": predicted_activations(
                           single["activation_bytes"], req)})
    return report


def grad_check(seed: int, dtype: str = "float32") -> dict:
    """On every rank: q, k, v `[1, 4, L, 8]` (L odd, so shards are uneven) requiring grad,
    through the ring's every mode and Ulysses; per method, the worst of dq, dk, dv's
    max |CP - float64 autograd| / max(1, max |float64 gradient|) on this rank's shards."""
    import torch.distributed as dist

    from cpcourse.ring import MODES, ring_attention
    from cpcourse.support.shards import shard
    from cpcourse.ulysses import ulysses_attention

    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    length = 2 * world * int(torch.randint(2, 6, (1,), generator=g)) + 1
    whole = [torch.randn(1, 4, length, 8, generator=g, dtype=torch.float64) for _ in range(4)]
    ref = [x.clone().requires_grad_() for x in whole[:3]]
    (torch.softmax(ref[0] @ ref[1].mT / 8 ** 0.5, -1) @ ref[2]).backward(whole[3])
    errors = {}
    for method in (*MODES, "ulysses"):
        # this rank's shards [1, 4, L/P, 8] of q, k, v and the output's gradient (L odd: uneven)
        q, k, v, dout = (shard(x, rank, world).to(getattr(torch, dtype)) for x in whole)
        q, k, v = (x.requires_grad_() for x in (q, k, v))
        out = (ulysses_attention(q, k, v) if method == "ulysses" else
               ring_attention(q, k, v, mode=method))
        out.backward(dout)
        errors[method] = max(float((x.grad.double() - shard(r.grad, rank, world)).abs().max())
                             / max(1.0, float(r.grad.abs().max()))
                             for x, r in zip((q, k, v), ref, strict=True))
    return {"length": length, "errors": errors}


def cp_traffic(batch: int, heads: int, tokens_per_rank: int, head_dim: int, world: int,
               elem: int = 2, acc: int = 4) -> list[dict]:
    """Bytes one rank sends per attention call, forward and backward, and what it holds for the
    backward (module docstrings of `cpcourse.ring` and `cpcourse.ulysses`): elements of
    `elem` bytes (bf16: 2), the ring's backward blocks in the accumulator's `acc` bytes."""
    shard = batch * heads * tokens_per_rank * head_dim  # elements of one of q, k, v, out
    saved = 4 * shard * elem + batch * heads * tokens_per_rank * 4  # q, k, v, out + lse
    a2a = 4 * shard * elem * (world - 1) // world  # q, k, v out and the output back
    return [
        {"method": "ring", "pass": "forward", "hops": world - 1,
         "bytes_sent": (world - 1) * 2 * shard * elem, "buffers": 2 * 2 * shard * elem,
         "saved_for_backward": saved},
        {"method": "ring", "pass": "backward", "hops": world,
         "bytes_sent": world * 4 * shard * acc, "buffers": 2 * 4 * shard * acc,
         "saved_for_backward": 0},
        {"method": "ulysses", "pass": "forward", "hops": 1, "bytes_sent": a2a,
         "buffers": 2 * 3 * shard * elem, "saved_for_backward": saved},
        {"method": "ulysses", "pass": "backward", "hops": 1, "bytes_sent": a2a,
         "buffers": 2 * 3 * shard * elem, "saved_for_backward": 0},
    ]
