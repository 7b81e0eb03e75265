"""The article the course grew from, audited: each figure it states, recomputed by cpcourse.

    python -m cpcourse.viz.article_audit            # prints the audit as a table

`ARTICLE` holds the figures the article states (its claims, so they are typed on purpose);
everything else is computed here from the calculators. A verdict compares the article's figure
with the recomputed one under the article's own assumptions (within 3%), and the `fix` column
says what the figure should be for a real model, or what it leaves out.
"""

from __future__ import annotations

import sys

from cpcourse.planner.costs import comm, memory
from cpcourse.planner.deployment import cost, tp_allreduce_bytes
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.planner.overheads import collective_latency
from cpcourse.planner.tokens import get_model, model_tokens, video_tokens
from cpcourse.support.layout import Layout
from cpcourse.viz import fmt

# The article's worked example: a 720p clip of 5 s at 24 fps, an 8x VAE and 2x2 patches, a DiT
# 4096 wide with 32 heads of 128, fp16. Cosmos-1.0-Diffusion-7B has exactly those widths.
SEED_MODEL = "cosmos-1.0-diffusion-7b"
ARTICLE = {
    "tokens_per_frame": 900, "tokens_16f": 14_400, "tokens_48f": 43_200,
    "entries_48f": 1.9e9, "tokens_5s": 432_000, "attention_bytes_per_head": 373e9,
    "qkv_bytes": 32e9, "tokens_per_rank": 54_000, "kv_bytes_per_hop_per_head": 27.6e6,
    "kv_bytes_per_hop": 884e6, "kv_bytes_total": 6.2e9, "comm_seconds_total": 14e-3,
    "compute_seconds_per_step": 20e-3, "link_GBps": 450, "cp": 8, "height": 720,
    "width": 1280, "fps": 24, "seconds": 5, "hidden": 4096, "heads": 32, "head_dim": 128,
}


def agrees(article: float, computed: float, rel: float = 0.03) -> bool:
    return abs(article - computed) <= rel * abs(computed)


def verdict(article: float, computed: float) -> str:
    if agrees(article, computed):
        return "right"
    r = article / computed
    return f"wrong ({fmt.ratio(r)} too high)" if r > 1 else f"wrong ({fmt.ratio(1 / r)} too low)"


def tp_across_nodes(model_id: str = SEED_MODEL, cp: int = 8, tp: int = 2, gpu: str = "h100",
                    intra: str | None = None, inter: str = "ib-ndr") -> dict:
    """The article's layout priced by the planner's own cost (`cpcourse.planner.deployment`):
    `model_id` at its default video on cp x tp GPUs, a ring of `cp` inside each node and TP
    pairs across nodes, on the GPU's default kernel.

    The planner's mesh puts TP innermost, so it cannot place TP across nodes itself: the
    compute, the ring and the all-reduce count and bytes are `cost`'s for Layout(ring=cp, tp=tp)
    with every group inside one node, and only the all-reduces move to the `inter` link
    (`seconds_per_step_<link>`, `exposed_fraction_<link>`: their share of the compute). Nothing
    overlaps an all-reduce: the next matmul needs the sum. CFG-parallel instead exchanges one
    latent-sized prediction per sampling step (`cfg_exchange_bytes_per_step`).
    """
    m, g = get_model(model_id), get_gpu(gpu)
    tok = model_tokens(model_id)
    c = cost(m, tok, g.id, Layout(ring=cp, tp=tp), gpus_per_node=cp * tp)
    per = c["breakdown"]["per_forward_seconds"]
    compute = per["linear"] + per["attention"] + per["ring_merge"] + per["elementwise"]
    waits = sum(per.values()) - compute - per["tp_allreduce"]  # ring, ulysses: inside a node
    reduces = c["breakdown"]["tp_all_reduces_per_forward"]
    one = tp_allreduce_bytes(c["tokens_per_rank"], m.hidden, tp)
    links = {name: get_link(name) for name in (intra or g.intra_link, inter)}
    out = {
        "model": m.id, "cp": cp, "tp": tp, "gpus": cp * tp, "tokens": tok.sequence_length,
        "tokens_per_rank": c["tokens_per_rank"], "kernel": c["kernel"],
        "kernel_efficiency": c["kernel_efficiency"], "assumes": g.assumes(),
        "block_compute_seconds": compute / m.layers,
        "allreduces_per_forward": reduces, "allreduces_per_block": reduces / m.layers,
        "allreduce_bytes_per_block": int(one * reduces / m.layers),
        "allreduce_bytes_per_forward": int(one * reduces),
        "cfg_exchange_bytes_per_step": (m.latent_channels * tok.latent_frames
                                        * tok.latent_height * tok.latent_width * 2),
        "layers": m.layers, "cfg_forwards": m.cfg_forwards,
    }
    for name, lk in links.items():
        # bytes over the link, plus each all-reduce's latency (as `cost` charges it)
        t = one * reduces / (lk.effective_gbps * 1e9) + reduces * collective_latency("all_reduce",
                                                                                  tp)
        out[f"allreduce_seconds_per_block_{name}"] = t / m.layers
        out[f"exposed_fraction_{name}"] = t / compute
        out[f"seconds_per_step_{name}"] = (c["forwards_per_step"] * (compute + waits + t)
                                           + c["breakdown"]["cfg_exchange_seconds"])
    out["intra"], out["inter"] = list(links)
    return out


def audit() -> list[dict]:
    """Every figure of the article next to cpcourse's, with a verdict and what to say instead."""
    a = ARTICLE
    h, w, fps, secs = a["height"], a["width"], a["fps"], a["seconds"]
    per_frame = video_tokens(h, w, 1).tokens_per_frame
    at32 = model_tokens("wan2.2-ti2v-5b", frames=1)
    n16 = per_frame * 16
    n48 = per_frame * 48
    causal17 = video_tokens(h, w, 17, vae_temporal=4).video_tokens
    causal49 = video_tokens(h, w, 49, vae_temporal=4).video_tokens
    seed = video_tokens(h, w, fps * secs)
    n = seed.video_tokens
    t4 = video_tokens(h, w, fps * secs + 1, vae_temporal=4)
    t8 = video_tokens(h, w, fps * secs + 1, vae_temporal=8)
    mem = memory(n, a["hidden"], a["heads"], dtype="fp16", cp=a["cp"])
    mem4 = memory(t4.video_tokens, a["hidden"], a["heads"], dtype="fp16")
    m = get_model(SEED_MODEL)
    assert (m.hidden, m.heads, m.head_dim) == (a["hidden"], a["heads"], a["head_dim"])
    c = comm(n, a["cp"], a["heads"], a["head_dim"], dtype="fp16",
             bandwidth_gbps=a["link_GBps"], layers=m.layers, cfg_forwards=m.cfg_forwards)
    tp = tp_across_nodes()
    e43 = a["tokens_48f"] ** 2
    # (claim, article, recomputed under the article's assumptions, formatter, kind, fix);
    # kind: "" plain, "premise" (arithmetic right on a wrong premise), "lower" (a lower bound).
    rows = [
        ("tokens per 720p frame (8x VAE, 2x2 patch)", a["tokens_per_frame"], per_frame,
         fmt.count, "", f"{fmt.count(per_frame)}: a token covers 16x16 pixels; about "
         f"{fmt.count(a['tokens_per_frame'])} needs 32x32 pixels per token "
         f"(Wan2.2-5B: {fmt.count(at32.tokens_per_frame)} at {at32.height}x{at32.width})"),
        ("tokens of 16 frames", a["tokens_16f"], a["tokens_per_frame"] * 16, fmt.count,
         "premise", f"{fmt.count(n16)} at the right per-frame count; {fmt.count(causal17)} "
         "for 17 frames through a 4x causal VAE"),
        ("tokens of 48 frames", a["tokens_48f"], a["tokens_per_frame"] * 48, fmt.count,
         "premise", f"{fmt.count(n48)}; {fmt.count(causal49)} for 49 frames through a 4x "
         "causal VAE"),
        ("score entries of a 43,200-token head", a["entries_48f"], e43, fmt.sci, "",
         f"{fmt.nbytes(e43 * 2)} per head per layer in fp16, if stored"),
        ("tokens of 720p, 5 s, 24 fps", a["tokens_5s"], n, fmt.count, "premise",
         f"only without time compression: {fmt.count(t4.video_tokens)} with a 4x causal "
         f"VAE ({t4.frames} frames), {fmt.count(t8.video_tokens)} with an 8x one"),
        ("one head's attention matrix", a["attention_bytes_per_head"],
         mem["attention_matrix_bytes_per_head"], fmt.nbytes, "",
         "per head and per layer, and only if stored (fused kernels never store it); "
         f"{fmt.nbytes(mem4['attention_matrix_bytes_per_head'])} with a 4x causal VAE"),
        ("Q, K and V", a["qkv_bytes"], mem["qkv_bytes"], fmt.nbytes, "",
         f"{fmt.nbytes(mem['qkv_bytes'])} per layer, batch 1 (3 x tokens x hidden x 2 B)"),
        ("tokens per rank at CP=8", a["tokens_per_rank"], mem["tokens_per_rank"], fmt.count,
         "", "CP splits the sequence, never the weights"),
        ("K/V per head per ring hop", a["kv_bytes_per_hop_per_head"],
         c["kv_bytes_per_hop_per_head"], fmt.nbytes, "", "per layer"),
        ("K/V per ring hop, all heads", a["kv_bytes_per_hop"], c["kv_bytes_per_hop"],
         fmt.nbytes, "", "per layer"),
        (f"K/V over {c['ring_hops']} hops", a["kv_bytes_total"], c["kv_bytes_total"],
         fmt.nbytes, "", f"per layer and per forward: {fmt.nbytes(c['kv_bytes_per_forward'])} "
         f"per GPU per sampling step ({m.layers} layers x {m.cfg_forwards} CFG forwards)"),
        (f"time of {c['ring_hops']} hops at {a['link_GBps']} GB/s", a["comm_seconds_total"],
         c["comm_seconds_total"], fmt.seconds, "",
         f"but compare one hop, {fmt.seconds(c['comm_seconds_per_hop'])}, with one step"),
        ("compute of one ring step", a["compute_seconds_per_step"],
         c["compute_seconds_per_step"], fmt.seconds, "lower",
         f"at {c['attention_efficiency']:.0%} of an H100's peak: "
         f"{fmt.ratio(c['compute_to_comm_ratio'])} one hop's time, so the ring hides"),
    ]
    out = []
    for what, art, ours, show, kind, fix in rows:
        v = verdict(art, ours)
        if kind == "premise":
            v = v.replace("right", "arithmetic right, premise wrong")
        shown = show(art)
        if kind == "lower":
            shown, v = f"more than {shown}", f"an underestimate ({fmt.ratio(ours / art)})"
        out.append({"claim": what, "article": shown, "cpcourse": show(ours),
                    "verdict": v, "fix": fix, "_article": art, "_cpcourse": ours})
    ndr = f"exposed_fraction_{tp['inter']}"
    out.append({
        "claim": "add TP=2 across nodes", "article": "TP=2 x CP=8 on 2 nodes",
        "cpcourse": f"{tp[ndr]:.0%} of each block waits on {tp['inter']}",
        "verdict": "wrong" if tp[ndr] > 0.1 else "right",
        "fix": f"keep TP inside NVLink ({tp['exposed_fraction_' + tp['intra']]:.0%} there); "
               f"span nodes with CFG-parallel: {fmt.nbytes(tp['cfg_exchange_bytes_per_step'])} "
               "per step", "_article": None, "_cpcourse": tp[ndr]})
    return out


def main(argv: list[str] | None = None) -> int:
    for r in audit():
        print(f"{r['claim'][:38]:38s} {r['article']:>14s} {r['cpcourse']:>28s}  {r['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
