"""The cost model of the tiny video DiT under CP: peak tensor bytes and bytes sent per rank.

    python -c "from cpcourse.tinydit.costs import *; from cpcourse.tinydit.model import DiTConfig; \
print(predicted_peak_bytes(DiTConfig(), [1, 4, 8, 16, 16], 2, 0))"

A ledger, read off the code: for each phase of a denoising step that can hold the most, the
tensors alive at that moment, in elements. Units: N_t = 2B * T_r * S tokens this rank holds in
the CFG batch (time split), N_s = 2B * T * S_r (space split, after the temporal all-to-all),
N_max = 2B * max_r(T_r) * S (the ring's receive buffers are sized for the largest shard);
h = hidden, f = MLP width, e = patch dim C*p*p, n = heads. Weights existed before sampling and
are not counted (CP replicates them: it divides activations, never weights).

    resident        sample state e/2 + CFG batch e + residual stream h        (per N_t)
    attention entry modulated input h + qkv 3h + rotated q, k 2h                (per N_t)
    spatial         entry + q, k, v folded per frame 3h + out h + lse n
    temporal a2a    entry + stacked qkv 3h + send buffer 3h (N_t) + receive 3h + re-shard 3h (N_s)
    temporal        entry + send 3h (N_t) + receive 3h + qkv 3h + folded 3h + out h + lse n (N_s)
                    (the all-to-all's buffers are held until the attention is done)
    temporal ring   entry + q, k, v folded per position 3h + 2 K/V buffers 4h (N_max)
                    + the in-place merge (the running out and the block's: 2h; lse rows 6n)
    full ring       entry + 2 K/V buffers 4h (N_max) + merge 2h + 6n (P >= 2; one call at P = 1)
    full ulysses    entry + the head all-to-all: stacked qkv 3h + send 3h + receive 3h + 3h
                    (P = 1: the send buffer is a view, 9h). Measured within 0.1% at even
                    splits; a rank holding fewer frames than its head-split share of the
                    sequence measures more (Ulysses' own buffers outlive its all-to-all).
    mlp             resident + modulated input h + fc1 out f + gelu out f
The peak is the largest phase; it falls as 1/P because every term is per local token.
"""

from __future__ import annotations

from cpcourse.mesh import usp_elements
from cpcourse.support.agreement import AGREED_CALLS
from cpcourse.support.errors import require
from cpcourse.support.shards import shard_sizes


def phase_elements(cfg, shape, world: int, rank: int, temporal_method: str = "all_to_all",
                   full_method: str = "ring") -> dict[str, int]:
    """Elements alive at each candidate peak of one denoising step on rank `rank`."""
    b, c, t, hl, wl = shape
    s = (hl // cfg.patch) * (wl // cfg.patch)
    h, f, e, n = cfg.hidden, cfg.hidden * cfg.mlp_ratio, c * cfg.patch ** 2, cfg.heads
    t_r, s_r = shard_sizes(t, world)[rank], shard_sizes(s, world)[rank]
    n_t, n_s = 2 * b * t_r * s, 2 * b * t * s_r
    n_max = 2 * b * max(shard_sizes(t, world)) * s
    n_attn = 2 if cfg.attention == "factored" else 1
    per_sample = 2 * b * 3 * (n_attn + 1) * h          # the block's modulation vectors
    resident = (e // 2 + e + h) * n_t + per_sample
    entry = resident + 6 * h * n_t
    merge = 2 * h * n_t + 6 * n * n_t if world > 1 else h * n_t + n * n_t
    phases = {"mlp": resident + (h + 2 * f) * n_t}
    if cfg.attention == "factored":
        phases["spatial"] = entry + (4 * h + n) * n_t
        if temporal_method == "all_to_all":
            phases["temporal a2a"] = entry + 6 * h * n_t + 6 * h * n_s
            phases["temporal"] = entry + 3 * h * n_t + (10 * h + n) * n_s
        else:
            phases["temporal"] = entry + 3 * h * n_t + (4 * h * n_max if world > 1 else 0) + merge
    elif full_method == "ring":
        phases["full"] = entry + (4 * h * n_max if world > 1 else 0) + merge
    else:  # at P = 1 the send buffer is a view of the stacked qkv: one head group, no reorder
        phases["full"] = entry + (12 if world > 1 else 9) * h * n_t
    return phases


def predicted_peak_bytes(cfg, shape, world: int, rank: int, temporal_method: str = "all_to_all",
                         full_method: str = "ring", elem_bytes: int = 4) -> int:
    """Predicted peak tensor bytes of sampling on rank `rank` of `world` (see the ledger)."""
    require(0 <= rank < world, f"rank must be in [0, {world}), got {rank}")
    phases = phase_elements(cfg, shape, world, rank, temporal_method, full_method)
    return max(phases.values()) * elem_bytes


def peak_phase(cfg, shape, world: int, rank: int, temporal_method: str = "all_to_all",
               full_method: str = "ring") -> str:
    """Which phase sets the peak (e.g. "temporal" for the all-to-all's buffers)."""
    phases = phase_elements(cfg, shape, world, rank, temporal_method, full_method)
    return max(phases, key=phases.get)


# --- traffic per mesh dim -----------------------------------------------------------------------

def _ring_bytes(calls: int, elems: int, ring: int, elem_bytes: int, steps) -> int:
    """Ring bytes per step of `calls` ring calls per step, each sending `elems` K/V elements
    in ring - 1 messages; every call after the group's first two adds a flag per message."""
    flags = ring - 1 if ring > 1 else 0
    if steps is None:
        return calls * (elems + flags) * elem_bytes
    total = steps * calls * elems + max(0, steps * calls - AGREED_CALLS) * flags
    return total * elem_bytes // steps


def predicted_bytes_per_step(cfg, shape, layout, rank: int, elem_bytes: int = 4,
                             steps: int | None = None) -> dict:
    """Bytes global `rank` sends per denoising step on each mesh dim, predicted from the code.

    cfg: a DiTConfig; shape: the whole latent `[B, C, T, Hl, Wl]`; layout: a
    `cpcourse.support.layout.Layout`. Per forward: every temporal or full attention runs USP over
    (ring, ulysses) on the rank's B_loc = 2B / cfg samples and H / tp heads; every attention and
    MLP ends in one tp all-reduce of `[B_loc, T_r, S, hidden]` (counted as a ring all-reduce,
    2 (T - 1) / T of the buffer); the cfg dim all-gathers the prediction `[B, T_r, S, C p p]`
    once. Equal to what `count_bytes` measures, byte for byte (tests/dist/test_mesh.py).
    The ring's messages carry one more element, the "shapes changed" flag, on every call but a
    group's first two (which agree shapes instead, `cpcourse.ring`): `steps` averages over a run
    of that many steps as the run does (total // steps); None gives a step of a long run.
    """
    from cpcourse.tinydit.tp import all_reduces_per_step

    b, c, t, hl, wl = shape
    s = (hl // cfg.patch) * (wl // cfg.patch)
    co = layout.coords(rank)
    cp_rank = co["ring"] * layout.ulysses + co["ulysses"]
    frames = shard_sizes(t, layout.cp)
    b_loc = b if layout.cfg == 2 else 2 * b
    heads = cfg.heads // layout.tp
    if cfg.attention == "full":
        u_el, r_el = usp_elements(b_loc, heads, cfg.head_dim, [f * s for f in frames], layout,
                                   cp_rank)
    else:  # temporal attention: S sequences over the frames, one per spatial position
        u_el, r_el = usp_elements(b_loc * s, heads, cfg.head_dim, frames, layout, cp_rank)
    tokens = b_loc * frames[cp_rank] * s
    payload = tokens * cfg.hidden * elem_bytes
    tp_t = layout.tp
    return {"cfg": (b * frames[cp_rank] * s * c * cfg.patch ** 2 * elem_bytes
                    if layout.cfg == 2 else 0),
            "ring": _ring_bytes(cfg.depth, r_el, layout.ring, elem_bytes, steps),
            "ulysses": cfg.depth * u_el * elem_bytes,
            "tp": all_reduces_per_step(cfg) * (2 * (tp_t - 1) * payload // tp_t)}
