# Yours to edit. Generated from solutions/ex09_mesh.py by tools/make_exercises.py
# stub-sha256: 8a6d75ef87045ea9 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 09.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 09.1 cfg_parallel_step: read notebook 09, \"The CFG-parallel step\". "
        "Hint: each rank holds half of the pair the guidance formula needs; after one "
        "exchange both hold both halves. Gather into one buffer with a slot per rank "
        "(rank 0's slot is the conditional prediction, rank 1's the unconditional), "
        "then let both ranks evaluate the same formula on the same two tensors, so "
        "they agree to the bit. (2 more: cpcourse.hint(\"09.1\"))"
    )


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
    # Exercise 09.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 09.2 mesh_position: read notebook 09, \"Which rank talks to which\". "
        "Hint: read the rank as a number in a mixed radix: the innermost digit is tp "
        "(the remainder by T), then ulysses, ring and cfg. A group of one dim is the "
        "ranks whose other three digits are the same as yours: rebuild the rank from "
        "the coordinates with that one digit run over its range. (2 more: "
        "cpcourse.hint(\"09.2\"))"
    )


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
    # Exercise 09.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 09.3 sp_mlp: read notebook 09, \"The MLP under Megatron sequence "
        "parallelism\". Hint: the first layer needs every token (this rank owns hidden "
        "features, not tokens), and the second layer leaves each rank a partial sum "
        "for every token; which collective turns a token shard into all tokens, which "
        "one turns partial sums of all tokens into this rank's finished tokens, and "
        "is the bias added before or after it? (Section 1's SP part.) (2 more: "
        "cpcourse.hint(\"09.3\"))"
    )


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
    # Exercise 09.4: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 09.4 choose_layout: read notebook 09, \"Design: a layout for two "
        "nodes\". Hint: take the dims one at a time with section 5's two facts: the "
        "inner dims' groups are neighbouring ranks, and each dim's traffic has its "
        "own size and its own tolerance for a slow link. Which dim sends the least "
        "and waits the least, so it may take the node boundary? Which dims must fit "
        "inside a node, and when does a group of neighbouring ranks fit (think of "
        "where the node boundaries fall)? What is left for the ring, and does a "
        "longer ring send more or less between nodes? (2 more: cpcourse.hint(\"09.4\"))"
    )
