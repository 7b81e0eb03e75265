"""The lines that explain a plan: why it won, what each runner-up loses, what the GPU holds.

    cpcourse plan --model hunyuanvideo-13b --height 720 --width 1280 --frames 129 --gpus 8

`cpcourse.planner.plan.plan` costs the layouts; these functions turn its costed dicts (a
`cpcourse.planner.deployment.cost` dict with layout, valid and reason) into the `reasoning`
sentences the command line prints: the largest terms, the tie, ring or Attention2D on a long CP
axis, the memory at the peak, and where the decode and the text encoder ran.
"""

from __future__ import annotations

from cpcourse.planner.costs import tiling_bytes_per_rank
from cpcourse.planner.hardware import generation_kernel, kernel_efficiency
from cpcourse.support.layout import Layout

NOT_COUNTED = "not counted (no size recorded)"  # never printed as 0.0 GB or 0 s


def why_not(best: dict, other: dict) -> str:
    """The term that costs `other` the most against `best`, per step."""
    a, b = best["breakdown"]["per_forward_seconds"], other["breakdown"]["per_forward_seconds"]
    fa, fb = best["forwards_per_step"], other["forwards_per_step"]
    diffs = {k: fb * b.get(k, 0.0) - fa * a.get(k, 0.0) for k in {**a, **b}}
    if not other["fits"] and best["fits"]:
        return "does not fit in the GPU's memory"
    term = max(diffs, key=diffs.get)
    return f"{term} costs {diffs[term]:+.3g} s per step more"


def kernel_line(g, kernel: str, price, seconds: float) -> str:
    """Which kernel an `auto` plan assumed, and what the kernel a current engine runs on this
    GPU's generation (`hardware.generation_kernel`) would give instead: the two assumptions
    side by side, neither chosen by what the published runs show."""
    gen, source = generation_kernel(g.id)
    head = f"Kernel assumed: {kernel} (the default, `hardware.default_kernel`)"
    if gen == kernel or kernel_efficiency(g.id, gen)[0] is None:
        return head + "; a current engine on this generation runs the same."
    return (head + f"; a current engine on {g.arch} runs {gen} ({source.split(';')[0]}): "
            f"{price(gen):.0f} s instead of {seconds:.0f} s.")


def memory_line(c: dict, g) -> str:
    """Per GPU at the peak, which phase it is and what it holds
    (`cpcourse.planner.pipeline_memory`)."""
    ph = c["breakdown"]["memory_phases"]
    peak = max(ph, key=ph.get)
    names = {"loop": "activations and buffers"}
    held = ", ".join(f"{names.get(k, k.replace('_', ' '))} {b / 1e9:.1f}"
                     for k, b in c["breakdown"]["memory_phase_parts"][peak].items())
    return (f"Per GPU: {c['per_gpu_bytes'] / 1e9:.1f} GB of {g.hbm_gb:g} GB at the peak, the "
            f"{peak} phase ({held}).")


def reason_lines(m, tok, g, best: dict, tie: list, none_fit: bool) -> list[str]:
    lay = Layout(**best["layout"])
    per = best["breakdown"]["per_forward_seconds"]
    pair = {1: "one forward per step (guidance-distilled)", 2: "a CFG pair per step"}.get(
        m.cfg_forwards, f"{m.cfg_forwards} guided forwards per step")
    out = [f"{m.name}: {tok.sequence_length:,} tokens; {m.heads} heads, {m.layers} layers; "
           f"{pair}.",
           f"{lay}: {best['seconds_per_step']:.3g} s per step ({best['forwards_per_step']} "
           f"forward(s)), of which attention {per['attention']:.3g} s and linear "
           f"{per['linear']:.3g} s per forward at {best['kernel']} "
           f"({best['kernel_efficiency']:.0%} of {g.bf16_tflops:g} TFLOP/s); plus "
           f"{best['seconds_fixed']:.3g} s once (VAE decode, text encoder)."]
    if tie:
        out.append("A tie (within 2%) with " + ", ".join(str(Layout(**t["layout"])) for t in tie)
                   + ": the model cannot tell them apart; pick by what else you need.")
    comm = {k: per.get(k, 0.0) for k in ("ulysses", "ring_exposed", "attn2d", "tp_allreduce",
                                        "fsdp_exposed")}
    top = max(comm, key=comm.get)
    out.append(f"Largest communication term: {top} {comm[top]:.3g} s per forward"
               + (f" over {best['links'][top.split('_')[0]]}" if best["links"].get(
                   top.split("_")[0]) else "") + ".")
    out += grid_lines(m, tok, best)
    out.append(memory_line(best, g)
               + (" Nothing fits: add GPUs, TP or FSDP, or offload." if none_fit else ""))
    return out + once_lines(best)


def once_lines(c: dict) -> list[str]:
    """Where the decode and the text encoder ran, and what each cost."""
    te, split = c["text_encoder"], c["vae_decode"]
    where = {"resident": "resident on every GPU through denoise and decode",
             "freed": "freed after encoding (reloaded for every video)",
             "cpu": "on the CPU", "own-gpu": "on a GPU of its own (+1 GPU)"}[te["place"]]
    if te["bytes_per_gpu"] is None:
        lines = [f"Text encoder: {NOT_COUNTED}."]
    else:
        lines = [f"Text encoder {where}: {te['bytes_per_gpu'] / 1e9:.1f} GB per GPU while "
                 f"encoding, {te['bytes_through_denoise'] / 1e9:.1f} GB through the denoise; "
                 f"{te['seconds']:.3g} s per video ({te['source']})."]
    if c["vae_decode_seconds"] is None or c["vae_decode_working_bytes"] is None:
        secs, work = c["vae_decode_seconds"], c["vae_decode_working_bytes"]
        lines.append("VAE decode: " + ("time " + (NOT_COUNTED if secs is None else
                                                  f"{secs:.3g} s") + ", working set "
                                       + (NOT_COUNTED if work is None else f"{work / 1e9:.1f} GB"))
                     + ".")
    elif split:
        lines.append(f"VAE decode split over {split['ranks']} GPUs: {c['vae_decode_seconds']:.3g}"
                     f" s ({split['compute_seconds']:.3g} s of decode, {split['link_seconds']:.3g}"
                     f" s on {split['link']} for {split['halo_bytes'] / 1e9:.2f} GB of halo "
                     f"rows and {(split['gather_bytes'] + split['pixel_bytes']) / 1e9:.2f} GB "
                     f"gathered), working set {c['vae_decode_working_bytes'] / 1e9:.1f} GB per "
                     "GPU.")
    else:
        lines.append(f"VAE decode whole on one GPU: {c['vae_decode_seconds']:.3g} s, working set "
                     f"{c['vae_decode_working_bytes'] / 1e9:.1f} GB.")
    lines.append(f"Serial part (no GPU count shortens it): {c['serial_seconds']:.3g} s.")
    return lines


def grid_lines(m, tok, best: dict) -> list[str]:
    """When the CP axis is long (4+ ranks): ring or Attention2D, which won and why. The ring's
    bytes per rank stay ~2x the sequence's K/V whatever R; the grid's fall as 1/sqrt(R), but
    the grid cannot hide them behind compute, so it wins where few heads are left for Ulysses
    (a long CP axis) and that axis sits in one NVLink domain."""
    lay = Layout(**best["layout"])
    if lay.ring < 4:
        return []
    heads, d = m.heads // (lay.ulysses * lay.tp), m.hidden // m.heads
    ring_b = tiling_bytes_per_rank("ring", tok.sequence_length, heads, d, lay.ring)
    rows = int(lay.ring ** 0.5)
    while lay.ring % rows:
        rows -= 1
    grid = lay.grid or (lay.ring // rows, rows)
    grid_b = tiling_bytes_per_rank("attn2d", tok.sequence_length, heads, d, lay.ring, grid)
    cap = f"Ulysses stops at {lay.ulysses} of {m.heads} heads"
    if lay.grid:
        return [f"Attention2D on the CP axis: {cap} (the rest of the GPUs must split the "
                f"sequence), and its {lay.ring} ranks share {best['links']['attn2d']}, where "
                f"the {lay.attn2d} grid sends {grid_b / 1e9:.2f} GB per rank per layer against "
                f"the ring's {ring_b / 1e9:.2f} GB (a ring's bytes do not shrink with its "
                "length; a grid's fall as 1/sqrt(R))."]
    return [f"A ring of {lay.ring}: {cap}; its hops hide behind the attention they carry "
            f"({best['breakdown']['per_forward_seconds']['ring_exposed']:.3g} s exposed per "
            f"forward), which Attention2D's collectives cannot (no engine overlaps them yet), "
            f"though a {grid[0]}x{grid[1]} grid would send {grid_b / 1e9:.2f} GB per rank per "
            f"layer, not {ring_b / 1e9:.2f}. Where the hops stop hiding (short blocks, per-hop "
            "costs this model leaves out), the grid wins inside one NVLink domain."]
