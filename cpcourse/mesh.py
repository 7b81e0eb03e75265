"""Combining parallelisms on a DeviceMesh: CFG-parallel x ring x Ulysses x tensor parallel.

    cpcourse generate --nproc 4 --layout cfg=2,ulysses=2 --compare --json

A world of P ranks is laid out as a 4-D grid `cfg x ring x ulysses x tp = P`, outer to inner, so
rank = ((c * R + r) * U + u) * T + t. The inner dims vary fastest, so the chattiest axes (tp: an
all-reduce after every attention and MLP; ulysses: four all-to-alls per attention) sit on
neighbouring ranks, which on a real cluster means inside one node, on NVLink. The ring passes
K/V blocks point to point and overlaps them with compute, so it tolerates the slower links across
nodes; cfg exchanges one prediction per denoising step and can go anywhere.

What each dim does to a rank's work (B videos, L tokens, H heads):
    cfg      the conditional pass on cfg rank 0, the unconditional on cfg rank 1 (batch B, not 2B);
             one all-gather of the prediction per step, the guided update the same on both
    ring     frames split over R x U ranks; K/V blocks passed around the ring (`cpcourse.ring`)
    ulysses  inside a ring rank's group of U, an all-to-all trades the sequence split for a head
             split, so the ring then runs on U times longer blocks with H / (U T) heads
    tp       heads and MLP columns split over T ranks (`cpcourse.tensor_parallel`); every tp rank
             holds the same tokens, so TP divides weights, FLOPs and the per-head tensors, but
             not the residual stream `[B, L, hidden]`: CP divides that
Heads must divide by U x T (the head limit USP lifts: the ring has none). `make_mesh` refuses
anything else with the layouts that would work.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from cpcourse.attention import attention_with_lse
from cpcourse.ring import ring_attention
from cpcourse.support.errors import InputError, require
from cpcourse.support.groups import (
    agree,
    all_gather_single,
    forward_only,
    pg_timeout_s,
    require_group,
)
from cpcourse.support.layout import DIMS, Layout, check_layout, divisors
from cpcourse.ulysses import heads_to_seq, seq_to_heads


def _short_timeout(backend: str):
    """Options that give a mesh dim's groups the default group's short timeout: DeviceMesh's
    subgroups otherwise get c10d's default of 30 minutes, and a mismatch would hang that long."""
    seconds = pg_timeout_s()
    opts = (dist.ProcessGroupNCCL.Options() if backend == "nccl"
            else dist.ProcessGroupGloo._Options())
    opts._timeout = timedelta(seconds=seconds)
    return opts


def make_mesh(cfg: int = 1, ring: int = 1, ulysses: int = 1, tp: int = 1,
              heads: int | None = None):
    """A torch DeviceMesh over the whole world, dims named ("cfg", "ring", "ulysses", "tp").

    Must be called by every rank (it creates the groups of every dim). `heads`, when given, is
    checked against ulysses x tp. Every dim's group gets the short timeout of the default group.
    """
    from torch.distributed.device_mesh import init_device_mesh

    layout = Layout(cfg=cfg, ring=ring, ulysses=ulysses, tp=tp)
    _, world = require_group(None, "make_mesh")
    check_layout(layout, world, heads)
    backend = dist.get_backend()
    device = "cuda" if backend == "nccl" else "cpu"
    override = {name: (backend, _short_timeout(backend)) for name in DIMS}
    return init_device_mesh(device, layout.shape, mesh_dim_names=DIMS,
                            backend_override=override)


def layout_of(mesh) -> Layout:
    """The Layout of a mesh `make_mesh` built."""
    return Layout(**{name: mesh.size(i) for i, name in enumerate(mesh.mesh_dim_names)})


def cp_coords(mesh) -> tuple[int, int]:
    """(cp_rank, cp_world): which frame shard this rank holds, over ring x ulysses ranks.
    Ring-major, so a Ulysses group's shards are neighbours in the sequence."""
    r, u = mesh.get_local_rank("ring"), mesh.get_local_rank("ulysses")
    return r * mesh.size(2) + u, mesh.size(1) * mesh.size(2)


def cp_group(mesh):
    """The process group of the ranks that share this rank's cfg and tp coordinates: the R x U
    ranks its frames are split over, in cp_rank order (for gathering frame shards). Created on
    first use, collectively (every rank creates every such group, in one order)."""
    cached = getattr(mesh, "_cpcourse_cp_group", None)
    if cached is not None:
        return cached
    lay = layout_of(mesh)
    mine = None
    timeout = _short_timeout(dist.get_backend())._timeout
    for c in range(lay.cfg):
        for t in range(lay.tp):
            ranks = [(c * lay.cp + i) * lay.tp + t for i in range(lay.cp)]
            group = dist.new_group(ranks, timeout=timeout)
            if dist.get_rank() in ranks:
                mine = group
    mesh._cpcourse_cp_group = mine
    return mine


def usp_attention(q, k, v, mesh, scale=None):
    """Attention of this rank's sequence shard over the whole sequence, Ulysses inside the
    `ulysses` dim, the ring across the `ring` dim (USP).

    q, k, v `[B, H, L_r, D]`: this rank's contiguous shard, cp_rank order (`cp_coords`), of the
    heads this rank holds (all of them, or H / tp under TP). Returns out `[B, H, L_r, D]`.
    After the all-to-all a rank holds its Ulysses group's U shards, which are neighbours in the
    sequence: one contiguous block of the ring, with H / U heads. U must divide H.
    """
    u_group, ring_group = mesh.get_group("ulysses"), mesh.get_group("ring")
    u, ring = mesh.size(2), mesh.size(1)
    forward_only("usp_attention", q, k, v,
                 use="ring_attention or ulysses_attention on one group")
    if u == 1:
        out = ring_attention(q, k, v, group=ring_group, scale=scale) if ring > 1 else \
            attention_with_lse(q, k, v, scale=scale)[0].to(q.dtype)
        return out
    require(q.shape == k.shape == v.shape,
            f"usp_attention takes self-attention shards of one shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[1] % u:
        raise InputError(f"usp_attention: the Ulysses degree {u} does not divide the {q.shape[1]}"
                         f" heads this rank holds: choose ulysses from "
                         f"{', '.join(map(str, divisors(q.shape[1])))}")
    lens = [s[2] for s in agree(u_group, q=q)["q"]]
    qh, kh, vh = seq_to_heads(torch.stack([q, k, v]), lens, u_group, "q, k, v")
    if ring > 1:
        out = ring_attention(qh, kh, vh, group=ring_group, scale=scale)
    else:
        out = attention_with_lse(qh, kh, vh, scale=scale)[0].to(q.dtype)
    del qh, kh, vh
    return heads_to_seq(out.contiguous(), lens, mesh.get_local_rank("ulysses"), u_group)


def usp_elements(batch: int, heads: int, head_dim: int, lens: list[int], layout,
                 cp_rank: int) -> tuple[int, int]:
    """Elements one USP attention call sends over (ulysses, ring), read off `usp_attention`.

    lens: the sequence length of every cp rank's shard (cp_rank order). Ulysses: q, k, v go out
    but for my own head group ((U-1) of U parts of 3 tensors), the output comes back the same
    way. Ring: at each of R-1 hops I pass on the K/V block I hold, whose length is the block of
    ring rank (r - s) mod R: after the all-to-all, a ring rank's block is its Ulysses group's.
    """
    u, ring = layout.ulysses, layout.ring
    r = cp_rank // u
    hp = heads // u
    blocks = [sum(lens[g * u:(g + 1) * u]) for g in range(ring)]
    ulysses = 0
    if u > 1:
        ulysses = batch * hp * head_dim * (3 * (u - 1) * lens[cp_rank] + blocks[r] - lens[cp_rank])
    ring_elems = sum(2 * batch * hp * head_dim * blocks[(r - s) % ring] for s in range(ring - 1))
    return ulysses, ring_elems


def cfg_branch(mesh) -> str:
    """"both" without CFG-parallel; else "cond" on cfg rank 0 and "uncond" on cfg rank 1."""
    if mesh is None or mesh.size(0) == 1:
        return "both"
    return ("cond", "uncond")[mesh.get_local_rank("cfg")]


def cfg_combine(pred: torch.Tensor, mesh, scale: float) -> torch.Tensor:
    """Classifier-free guidance across the cfg dim: this rank's prediction in (its branch,
    `cfg_branch`), the guided one out, `uncond + scale * (cond - uncond)`, the same on both.

    One all-gather of a prediction-sized tensor per denoising step: that is all CFG-parallel
    sends, against an all-to-all or a ring per attention layer for the sequence dims.
    """
    require(mesh.size(0) == 2, "cfg_combine needs a mesh with cfg = 2")
    group = mesh.get_group("cfg")
    both = pred.new_empty((2,) + tuple(pred.shape))
    all_gather_single(both, pred.contiguous(), group=group)
    cond, uncond = both[0], both[1]
    return uncond + scale * (cond - uncond)


def group_names(mesh) -> dict:
    """{process group: dim name} for the dims of `mesh` with more than one rank, to read a
    `count_bytes()` counter's `by_group` per mesh dim."""
    out = {}
    for i, name in enumerate(mesh.mesh_dim_names):
        if mesh.size(i) > 1:
            out[mesh.get_group(name)] = name
    return out


def bytes_by_dim(sent, mesh) -> dict[str, int]:
    """Bytes a `count_bytes()` counter saw, per mesh dim (every dim present, 0 when idle); the
    gather of frame shards over `cp_group` under "gather" (when sent), any other group under
    "other"."""
    names = group_names(mesh)
    if getattr(mesh, "_cpcourse_cp_group", None) is not None:
        names[mesh._cpcourse_cp_group] = "gather"  # frame shards gathered over ring x ulysses
    out = {name: 0 for name in DIMS}
    for group, nbytes in sent.by_group.items():
        out[names.get(group, "other")] = out.get(names.get(group, "other"), 0) + nbytes
    if not out.get("other"):
        out.pop("other", None)
    return out
