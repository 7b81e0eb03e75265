"""Bytes a rank of diffusers' Wan sends per mesh dim, predicted from the code that sends them.

    python -m cpcourse.cli models --arch wan --nproc 4 --layout cfg=2,ulysses=2 --sample-steps 2

Per forward, on global rank r of a `cpcourse.support.layout.Layout` (C, R, U, T), with B samples,
this rank's L_r video tokens (its frames times tokens per frame), N text tokens, `dim` hidden, H
heads of `head_dim`, and element size e:
    ring, ulysses  every block's self-attention (attn1) runs USP on H / T heads: the formulas of
                   `cpcourse.mesh.usp_elements`, per block. Cross-attention (attn2)
                   attends the replicated text locally: nothing on these dims.
    tp             every block: 3 all-reduces of `[B, L_r, dim]` (attn1 out, attn2 out, FFN out)
                   and 4 of the RMSNorm's float32 squares (`[B, L_r, 1]` for attn1's q and k and
                   attn2's q, `[B, N, 1]` for attn2's k), each 2 (T - 1) / T of its buffer
    gather         after proj_out, the tokens are all-gathered over the R x U ranks, padded to
                   the longest shard: (R U - 1) x B x max L x out features (not with shard_io,
                   which gathers the latents once, at the end)
    cfg            a sampler step all-gathers this rank's prediction once (cfg = 2)
A sampler step runs 2 forwards (the CFG pair, one after the other) or 1 under cfg = 2.
"""

from __future__ import annotations

import math

from cpcourse.support.shards import shard_sizes


def _all_reduce(payload: int, tp: int) -> int:
    return 2 * (tp - 1) * payload // tp  # as support.bytecount counts a ring all-reduce


def predicted_bytes(model, inputs: dict, req, rank: int) -> dict | None:
    """What `rank_forward`'s one measured run of `req` (a `cpcourse.runs.models.ModelsRequest`
    with a layout) sends, per dim; None for models other than Wan."""
    from cpcourse.mesh import usp_elements
    from cpcourse.models.split import latent_grid

    if type(model).__name__ != "WanTransformer3DModel":
        return None
    lay = req.layout
    cfg = model.config
    co = lay.coords(rank)
    cp_rank = co["ring"] * lay.ulysses + co["ulysses"]
    latents = inputs["hidden_states"]
    b, e = latents.shape[0], latents.element_size()
    frames, pph, ppw = latent_grid(model, latents)
    sizes = shard_sizes(frames, lay.cp)
    lens = [n * pph * ppw for n in sizes]
    heads, hd = cfg.num_attention_heads, cfg.attention_head_dim
    dim, depth = heads * hd, cfg.num_layers
    n_text = inputs["encoder_hidden_states"].shape[1]
    u_el, r_el = usp_elements(b, heads // lay.tp, hd, lens, lay, cp_rank)
    mine = lens[cp_rank]
    tp = depth * (3 * _all_reduce(b * mine * dim * e, lay.tp)
                  + 3 * _all_reduce(b * mine * 4, lay.tp) + _all_reduce(b * n_text * 4, lay.tp))
    per_forward = {"cfg": 0, "ring": depth * r_el * e, "ulysses": depth * u_el * e, "tp": tp}
    shard_io = bool(req.shard_io)
    out_features = cfg.out_channels * math.prod(cfg.patch_size)
    gather_forward = 0 if shard_io else (lay.cp - 1) * b * max(lens) * out_features * e
    pt = cfg.patch_size[0]
    latent_elems = latents.numel() // latents.shape[2]  # per latent frame
    gather_end = (lay.cp - 1) * max(sizes) * pt * latent_elems * e if shard_io else 0
    steps = req.sample_steps or 0
    forwards = steps * (1 if lay.cfg == 2 else 2) if steps else 1
    out = {k: v * forwards for k, v in per_forward.items()}
    if steps and lay.cfg == 2:
        pred = sizes[cp_rank] * pt * latent_elems if shard_io else latents.numel() // 1
        out["cfg"] = steps * pred * e
    gather = forwards * gather_forward + gather_end
    if gather:
        out["gather"] = gather
    return out
