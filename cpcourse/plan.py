"""Plan a CP x TP x CFG-parallel layout for a real model on N GPUs (a first, explainable version).

    cpcourse plan --model cosmos-1.0-diffusion-7b --height 704 --width 1280 --frames 121 --gpus 8

Every layout that the model's heads and the GPU count allow is costed with the same model:
per-GPU memory (weights / TP + one layer's activations on the local shard + the ring's K/V
buffers) and time per sampling step (attention and linear compute at achievable rates, the ring's
exposed communication, Ulysses all-to-alls, TP all-reduces). The fastest layout that fits wins;
the reasons are printed beside it. Mesh order from outer to inner: CFG, ring, Ulysses, TP, so
that the chattiest groups (TP, Ulysses) stay inside a node's NVLink domain.
"""

from __future__ import annotations

import math

from cpcourse.costs import MAX_GPUS, attention_flops, comm
from cpcourse.hardware import get_gpu, get_link
from cpcourse.support.errors import positive_int, require
from cpcourse.tokens import facts, get_model, model_tokens

BYTES = 2  # bf16 inference


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(sqrt n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _cost(m, tok, gpu, gpus_per_node: int, cfg: int, tp: int, uly: int, ring: int) -> dict:
    n = tok.sequence_length
    cp = uly * ring
    nvlink, ib = get_link(gpu.intra_link), get_link("ib-ndr")
    # CP groups are contiguous blocks of cp*tp GPUs: one larger than a node crosses InfiniBand.
    ring_link = nvlink if cp * tp <= gpus_per_node else ib
    uly_link = nvlink if uly * tp <= gpus_per_node else ib
    local = math.ceil(n / cp)
    matmul = gpu.bf16_tflops * 1e12 * float(facts()["calculator_defaults"]["matmul_efficiency"])
    attn_rate = gpu.attention_flops()
    per_layer_params = m.params_b * 1e9 / m.layers
    attn_s = attention_flops(n, n, m.head_dim, m.heads) / (cp * tp) / attn_rate
    linear_s = 2 * n * per_layer_params / (cp * tp) / matmul
    ring_exposed = uly_s = tp_s = 0.0
    if ring > 1:
        c = comm(n, ring, max(1, m.heads // (uly * tp)), m.head_dim, link=ring_link.id,
                 gpu=gpu.id)
        ring_exposed = max(0.0, c["comm_seconds_per_hop"] - c["compute_seconds_per_step"]) * (
            ring - 1)
    if uly > 1:
        uly_s = 4 * local * (m.hidden // tp) * BYTES * (uly - 1) / uly / (
            uly_link.effective_gbps * 1e9)
    if tp > 1:
        # Two all-reduces of the local hidden state per block, ring all-reduce volume 2(tp-1)/tp.
        tp_s = 2 * 2 * (tp - 1) / tp * local * m.hidden * BYTES / (nvlink.effective_gbps * 1e9)
    forwards = m.cfg_forwards // cfg
    step_s = forwards * m.layers * (attn_s + linear_s + ring_exposed + uly_s + tp_s)
    weights = int(m.params_b * 1e9 * BYTES)
    acts = local * (5 * m.hidden + m.ffn) * BYTES // tp
    ring_buf = 2 * 2 * local * m.hidden * BYTES // (tp * uly) if ring > 1 else 0
    per_gpu = weights // tp + acts + ring_buf
    return {
        "cfg_parallel": cfg, "tp": tp, "cp": cp, "ulysses": uly, "ring": ring,
        "tokens_per_rank": local, "ring_link": ring_link.id if ring > 1 else None,
        "per_gpu_bytes": per_gpu, "weights_bytes_per_gpu": weights // tp,
        "fits": per_gpu <= gpu.hbm_bytes,
        "seconds_per_step": step_s,
        "seconds_per_layer": {"attention": attn_s, "linear": linear_s,
                              "ring_exposed": ring_exposed, "ulysses": uly_s, "tp": tp_s},
    }


def plan(model_id: str, height: int | None = None, width: int | None = None,
         frames: int | None = None, gpus: int = 8, gpu: str = "h100", nodes: int = 1) -> dict:
    """The recommended layout for `model_id` on `gpus` GPUs over `nodes` nodes, with reasons."""
    m = get_model(model_id)
    tok = model_tokens(model_id, height, width, frames)
    gpus, nodes = positive_int("--gpus", gpus), positive_int("--nodes", nodes)
    require(gpus <= MAX_GPUS, f"--gpus {gpus} is more GPUs than any cluster has: "
            f"use {MAX_GPUS} or fewer")
    require(gpus % nodes == 0, f"--gpus {gpus} do not split evenly over --nodes {nodes}")
    g = get_gpu(gpu)
    per_node = gpus // nodes
    candidates = []
    for cfg in ([1, 2] if m.cfg_forwards == 2 and gpus % 2 == 0 else [1]):
        for tp in (t for t in _divisors(per_node) if m.heads % t == 0):
            if (gpus // cfg) % tp:
                continue
            cp = gpus // (cfg * tp)
            for uly in (u for u in _divisors(cp) if (m.heads // tp) % u == 0):
                if cp <= tok.sequence_length:
                    candidates.append(_cost(m, tok, g, per_node, cfg, tp, uly, cp // uly))
    require(candidates, f"no layout of {gpus} GPUs fits {m.id}: try fewer GPUs")
    fitting = [c for c in candidates if c["fits"]]
    pool = fitting or candidates
    best = min(pool, key=lambda c: (c["seconds_per_step"], c["tp"], c["ring"]))
    if m.cfg_forwards == 1:
        cfg_note = "Guidance-distilled: one forward per step, so there is no CFG pair to split."
    elif best["cfg_parallel"] == 2:
        cfg_note = ("Real CFG runs 2 forwards per step; CFG-parallel puts them on 2 GPU groups "
                    "with one exchange per step.")
    else:
        cfg_note = "Real CFG runs 2 forwards per step, here one after the other."
    reasons = [
        f"{m.name}: {tok.sequence_length:,} tokens ({tok.token_frames} x {tok.tokens_per_frame:,}"
        f" video{' + text, joint' if m.text_joint else ''}); {m.heads} heads, {m.layers} layers,"
        f" {m.params_b:g}B parameters = {m.params_b * 2:g} GB of bf16 weights.",
        cfg_note,
        f"TP={best['tp']}: " + ("weights fit on one GPU, so TP would only add blocking "
                                "all-reduces" if best["tp"] == 1 else
                                "weights or time need it; kept inside one node's NVLink"),
        f"CP={best['cp']} (Ulysses {best['ulysses']} x ring {best['ring']}): "
        f"{best['tokens_per_rank']:,} tokens per rank."
        + (f" Ulysses needs heads divisible by its degree ({m.heads} heads)."
           if best["ulysses"] > 1 else ""),
    ]
    if best["ring"] > 1:
        c = comm(tok.sequence_length, best["ring"], m.heads // (best["ulysses"] * best["tp"]),
                 m.head_dim, link=best["ring_link"], gpu=g.id)
        reasons.append(
            f"Ring over {best['ring_link']}: per hop {c['comm_seconds_per_hop'] * 1e3:.2f} ms "
            f"vs {c['compute_seconds_per_step'] * 1e3:.2f} ms compute per step -> "
            f"{'hidden' if c['hidden'] else 'NOT hidden'} (needs > "
            f"{c['min_tokens_per_rank_to_hide']:,} tokens per ring rank).")
    reasons.append(f"Per GPU: {best['per_gpu_bytes'] / 1e9:.1f} GB of {g.hbm_gb:g} GB "
                   f"({'fits' if best['fits'] else 'does NOT fit: add GPUs'}); text encoder and "
                   "VAE are not counted.")
    return {
        "model": m.id, "gpu": g.id, "gpus": gpus, "nodes": nodes,
        "tokens": tok.as_dict(), "sequence_length": tok.sequence_length,
        "hbm_bytes": g.hbm_bytes, **{k: best[k] for k in (
            "cfg_parallel", "tp", "cp", "ulysses", "ring", "tokens_per_rank", "ring_link",
            "per_gpu_bytes", "fits", "seconds_per_step")},
        "reasoning": reasons,
        "alternatives": sorted(candidates, key=lambda c: c["seconds_per_step"]),
    }
