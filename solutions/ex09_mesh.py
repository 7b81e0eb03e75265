"""Exercises of notebook 09, combining parallelisms on a mesh: CFG-parallel, USP's layout, TP.

    python -m pytest tests/graded --ex 09.1 --impl exercises

Three pieces of `cpcourse.mesh` and `cpcourse.tensor_parallel`, written by you: the one exchange
per denoising step that CFG-parallel makes (`cpcourse.mesh.cfg_combine`), where a rank sits in a
cfg x ring x ulysses x tp mesh and which ranks it talks to over each sequence dim
(`cpcourse.support.layout.Layout.coords`, `cpcourse.mesh.cp_coords`, `make_mesh`'s groups), and a
Megatron-style MLP with sequence parallelism: the tokens split outside it, the hidden features
inside it, and no all-reduce (`cpcourse.tensor_parallel`). Then a design choice (09.4): the
layout of a multi-node run, judged by the bytes it sends between nodes. Check yours in the
notebook with `cpcourse.check("09.1")`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from cpcourse.support.groups import all_gather_single, reduce_scatter_single
from cpcourse.support.layout import Layout


def cfg_parallel_step(pred: torch.Tensor, group, scale: float) -> torch.Tensor:
    """Classifier-free guidance split over two ranks: one exchange, the guided prediction on both.

    pred `[B, ...]` (any shape, floating point): this rank's prediction for the latents x_t of
    this step: the CONDITIONAL one on rank 0 of `group`, the UNCONDITIONAL one on rank 1 (the
    convention of `cpcourse.mesh.cfg_branch`). group: a process group of exactly 2 ranks (the
    mesh's "cfg" dim; None is the default group). Sends this rank's prediction once (one
    collective carrying pred's bytes, nothing else) and returns
    `uncond + scale * (cond - uncond)`: pred's shape and dtype, bitwise the same on both ranks.
    """
    # BEGIN SOLUTION 09.1 | notebook 09, "The CFG-parallel step"
    # | hint: each rank holds half of the pair the guidance formula needs; after one exchange
    # | both hold both halves. Gather into one buffer with a slot per rank (rank 0's slot is the
    # | conditional prediction, rank 1's the unconditional), then let both ranks evaluate the
    # | same formula on the same two tensors, so they agree to the bit.
    # | hint2: pred [1, 128, 16] on each rank: a buffer [2, 1, 128, 16] filled by one all-gather
    # | holds cond in [0] and uncond in [1] on BOTH ranks; with scale 4, uncond 0.5 and cond 1.0
    # | give 0.5 + 4 * 0.5 = 2.5 everywhere. An all-reduce of a zero-padded [2, ...] buffer also
    # | works but sends twice the bytes.
    # | hint3: both = pred.new_empty((2, *pred.shape)); all_gather_single(both,
    # | pred.contiguous(), group=group); cond, uncond = both[0], both[1]; return uncond + scale
    # | * (cond - uncond).
    both = pred.new_empty((2, *pred.shape))
    all_gather_single(both, pred.contiguous(), group=group)
    cond, uncond = both[0], both[1]
    return uncond + scale * (cond - uncond)
    # END SOLUTION


def mesh_position(rank: int, layout) -> dict:
    """Where global `rank` sits in a cfg x ring x ulysses x tp mesh, and who it talks to.

    layout: a `cpcourse.support.layout.Layout` with degrees C = layout.cfg, R = layout.ring,
    U = layout.ulysses, T = layout.tp (world C R U T). Ranks are laid out outer to inner,
    rank = ((c * R + r) * U + u) * T + t, so the inner dims are neighbouring ranks. Returns
        {"coords": {"cfg": c, "ring": r, "ulysses": u, "tp": t},
         "cp_rank": r * U + u,            # which frame shard it holds (ring-major)
         "ulysses": [...],                # global ranks of its Ulysses group, ascending:
                                          #   the same c, r, t, every u in 0 .. U - 1
         "ring": [...]}                   # global ranks of its ring group, ascending:
                                          #   the same c, u, t, every r in 0 .. R - 1
    Work it out from the degrees (do not call layout.coords: the grader compares with it, and
    with the groups `cpcourse.mesh.make_mesh` builds).
    """
    # BEGIN SOLUTION 09.2 | notebook 09, "Which rank talks to which"
    # | hint: read the rank as a number in a mixed radix: the innermost digit is tp (the
    # | remainder by T), then ulysses, ring and cfg. A group of one dim is the ranks whose other
    # | three digits are the same as yours: rebuild the rank from the coordinates with that one
    # | digit run over its range.
    # | hint2: cfg2 x ring2 x ulysses2 (T = 1, 8 ranks): rank 6 = ((1 * 2 + 1) * 2 + 0) * 1 + 0
    # | has c = 1, r = 1, u = 0, t = 0 and cp_rank 2; its Ulysses group is [6, 7] (u = 0, 1) and
    # | its ring group [4, 6] (r = 0, 1). With tp = 2 inside, neighbours in a Ulysses group are
    # | T = 2 ranks apart.
    # | hint3: coords: for name, size in (tp, T), (ulysses, U), (ring, R), (cfg, C): value, rank
    # | = rank % size, rank // size. Then at = lambda c, r, u, t: ((c * R + r) * U + u) * T + t;
    # | ulysses = [at(c, r, x, t) for x in range(U)]; ring = [at(c, x, u, t) for x in range(R)].
    sizes = {"cfg": layout.cfg, "ring": layout.ring, "ulysses": layout.ulysses, "tp": layout.tp}
    coords, rest = {}, rank
    for name in ("tp", "ulysses", "ring", "cfg"):
        coords[name], rest = rest % sizes[name], rest // sizes[name]
    c, r, u, t = (coords[n] for n in ("cfg", "ring", "ulysses", "tp"))
    R, U, T = sizes["ring"], sizes["ulysses"], sizes["tp"]

    def at(c, r, u, t):
        return ((c * R + r) * U + u) * T + t

    return {"coords": {n: coords[n] for n in ("cfg", "ring", "ulysses", "tp")},
            "cp_rank": r * U + u,
            "ulysses": [at(c, r, x, t) for x in range(U)],
            "ring": [at(c, x, u, t) for x in range(R)]}
    # END SOLUTION


def sp_mlp(x: torch.Tensor, mlp: torch.nn.Sequential, group=None) -> torch.Tensor:
    """A two-layer MLP under Megatron TP with sequence parallelism, over the T ranks of `group`.

    x `[L / T, B, d]`: this rank's shard of the tokens (Megatron's sequence-first layout: rank i
    holds tokens i * L / T .. (i + 1) * L / T - 1, T divides L), as the norms and the residual
    stream hold them under SP. mlp: an `nn.Sequential(nn.Linear(d, f), activation,
    nn.Linear(f, d))`, both layers with biases, the activation elementwise: the whole MLP (here
    every rank holds it; a real TP rank would load only its slice). The weights are split as in
    plain Megatron TP: rank i of `group` owns the hidden features i * f / T .. (i + 1) * f / T - 1
    (T divides f), and no rank ever holds all f of a token.
    Returns `[L / T, B, d]`: this rank's tokens of mlp(x of all ranks), up to float rounding.
    No all-reduce: each rank sends exactly the bytes of ONE all-reduce of the whole output
    `[L, B, d]`, 2 (T - 1) / T of it, and nothing else.
    """
    # BEGIN SOLUTION 09.3 | notebook 09, "The MLP under Megatron sequence parallelism"
    # | hint: the first layer needs every token (this rank owns hidden features, not tokens), and
    # | the second layer leaves each rank a partial sum for every token; which collective turns
    # | a token shard into all tokens, which one turns partial sums of all tokens into this
    # | rank's finished tokens, and is the bias added before or after it? (Section 1's SP part.)
    # | hint2: L = 6, B = 1, d = 4, f = 8, T = 2: rank 1 holds tokens 3 .. 5 `[3, 1, 4]` and
    # | hidden features 4 .. 7. Gathered x is `[6, 1, 4]`; its hidden slice `[6, 1, 4]`; its
    # | partial output `[6, 1, 4]`; summed over the 2 ranks and cut to tokens 3 .. 5: `[3, 1, 4]`.
    # | Each rank sends 3 * 4 floats to gather and 3 * 4 to reduce: 24, as an all-reduce of 6 * 4.
    # | hint3: all_gather_single(xs [L, B, d], x); h = act(F.linear(xs, fc1.weight[s],
    # | fc1.bias[s])); y = F.linear(h, fc2.weight[:, s]); reduce_scatter_single(out [L / T, B,
    # | d], y) (both from cpcourse.support.groups: dim 0 by rank); return out + fc2.bias.
    fc1, act, fc2 = mlp[0], mlp[1], mlp[2]
    i, n = dist.get_rank(group), dist.get_world_size(group)
    f = fc1.out_features
    s = slice(i * f // n, (i + 1) * f // n)
    xs = x.new_empty(n * x.shape[0], *x.shape[1:])
    all_gather_single(xs, x.contiguous(), group=group)
    h = act(F.linear(xs, fc1.weight[s], fc1.bias[s]))
    y = F.linear(h, fc2.weight[:, s]).contiguous()
    out = y.new_empty(x.shape[0], *y.shape[1:])
    reduce_scatter_single(out, y, group=group)
    return out + fc2.bias
    # END SOLUTION


def choose_layout(gpus: int, gpus_per_node: int, heads: int, cfg_forwards: int,
                  tp: int) -> Layout:
    """Your layout for a run of `gpus` GPUs in nodes of `gpus_per_node`: a `Layout` of `gpus`
    ranks with `tp` as given.

    The model has `heads` attention heads and runs `cfg_forwards` forwards per denoising step
    (2 with classifier-free guidance, 1 when guidance-distilled); it needs TP `tp` to fit in a
    GPU's memory (tp divides gpus_per_node and heads). Ranks sit on the mesh as `make_mesh`
    lays them out, and node n holds ranks n * gpus_per_node .. (n + 1) * gpus_per_node - 1.
    Choose the layout that the heads allow, whose blocking collectives (TP's all-reduces,
    Ulysses' all-to-alls) never leave a node, and that, among those, sends the fewest bytes per
    denoising step between nodes. The check prices every layout with the bytes of section 6
    put on the links of section 5; where several are equally good, any of them passes.
    """
    # BEGIN SOLUTION 09.4 | notebook 09, "Design: a layout for two nodes"
    # | hint: take the dims one at a time with section 5's two facts: the inner dims' groups are
    # | neighbouring ranks, and each dim's traffic has its own size and its own tolerance for a
    # | slow link. Which dim sends the least and waits the least, so it may take the node
    # | boundary? Which dims must fit inside a node, and when does a group of neighbouring ranks
    # | fit (think of where the node boundaries fall)? What is left for the ring, and does a
    # | longer ring send more or less between nodes?
    # | hint2: 16 GPUs in 2 nodes of 8, 24 heads, two forwards, tp 1: CFG-parallel across the
    # | nodes (one prediction per step), then each node's 8 ranks are one cfg group: Ulysses 8
    # | (24 % 8 == 0) or ring 2 x Ulysses 4 or ring 8, nothing but the cfg exchange between the
    # | nodes. Guidance-distilled, the same cluster: the ring must cross. Ring 2 x Ulysses 8: in
    # | each of 8 rings both ranks send one block of N/2 tokens x hidden/8 across, N x hidden in
    # | all per layer; ring 4 x Ulysses 4: in each of 4 rings 2 of the 4 hops cross, 3 blocks of
    # | N/4 x hidden/4 each, 1.5 N x hidden. 12 GPUs in nodes of 4, 6 heads, two forwards: a cfg
    # | group is ranks 0-5, so Ulysses 3 would straddle a node (ranks 3 and 4); Ulysses 2 fits.
    # | hint3: cfg = 2 if cfg_forwards == 2 else 1; n = gpus // (cfg * tp); ulysses = the largest
    # | u dividing n with heads % (u * tp) == 0 and gpus_per_node % (u * tp) == 0; ring = n //
    # | ulysses; return Layout(cfg=cfg, ring=ring, ulysses=ulysses, tp=tp).
    cfg = 2 if cfg_forwards == 2 and gpus % (2 * tp) == 0 else 1
    n = gpus // (cfg * tp)  # the sequence ranks of one cfg group
    ulysses = max(u for u in range(1, n + 1)
                  if n % u == 0 and heads % (u * tp) == 0 and gpus_per_node % (u * tp) == 0)
    return Layout(cfg=cfg, ring=n // ulysses, ulysses=ulysses, tp=tp)
    # END SOLUTION
