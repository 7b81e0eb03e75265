"""Plan a cfg x ring x ulysses x tp layout for a real model on N GPUs.

    cpcourse plan --model hunyuanvideo-13b --height 720 --width 1280 --frames 129 --gpus 8
    cpcourse plan --model wan2.1-t2v-14b --gpus 8 --gpu h800 --layout ulysses=8 --json

Every layout of the GPUs (`cpcourse.support.layout.layouts`) is checked against the model's rules
(heads divisible by ulysses x tp, one forward per step for a guidance-distilled model,
HunyuanVideo's split of the latent height or else width) and costed by
`cpcourse.planner.deployment.cost`. The fastest valid layout that fits wins; layouts within 2% of
it are named as a tie, never explained as a reasoned choice. `cpcourse.planner.validation` checks
the planner against published runs (`cpcourse plan --validate`) and gives its track record on the
runs nearest to a plan, which the command line prints with every answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpcourse.planner.deployment import cost
from cpcourse.planner.hardware import (
    KERNELS,
    default_kernel,
    generation_kernel,
    get_gpu,
    kernel_efficiency,
)
from cpcourse.planner.parallel_vae import check_splittable
from cpcourse.planner.pipeline_memory import BF16, RESIDENT, Residency, decode_working_bytes
from cpcourse.planner.tokens import ModelPreset, TokenCount, as_preset, get_model, model_tokens
from cpcourse.planner.uncertainty import interval
from cpcourse.planner.uncertainty import sources as interval_sources
from cpcourse.support.errors import InputError, positive_int, require
from cpcourse.support.layout import MAX_WORLD, Layout, layouts, with_attn2d

TIE = 0.02  # layouts within 2% of the best are a tie: the model is not that precise
NOT_COUNTED = "not counted (no size recorded)"  # never printed as 0.0 GB or 0 s


def validity(model: ModelPreset | str, tok, layout: Layout) -> str | None:
    """Why the model cannot run this layout, or None."""
    m = as_preset(model)
    if layout.cfg == 2 and m.cfg_forwards == 1:
        return f"{m.name} is guidance-distilled (one forward per step): there is no CFG pair"
    if m.heads % (layout.ulysses * layout.tp):
        return (f"ulysses x tp = {layout.ulysses * layout.tp} does not divide the {m.heads} "
                "heads")
    sp = layout.cp
    if sp > tok.sequence_length:
        return f"{sp} CP ranks for {tok.sequence_length} tokens"
    rule, src = m.split_rule or (None, None)
    if rule == "latent height or else width" and sp > 1:
        rows, cols = tok.latent_height // 2, tok.latent_width // 2
        if rows % sp and cols % sp:
            return (f"{m.name.split()[0]} splits the latent height ({rows} token rows) or else "
                    f"the width ({cols} columns) over its {sp} sequence-parallel ranks: neither "
                    f"divides ({src})")
    return None


def cost_layout(model: ModelPreset | str, tok, gpu_id: str, layout: Layout, gpus_per_node: int,
                kernel: str, fsdp: bool, steps: int, released: bool = False,
                residency: Residency = RESIDENT, parallel_vae: bool = False) -> dict:
    """One layout: valid, reason, and (when valid) its costs."""
    reason = validity(model, tok, layout)
    out = {"layout": layout.as_dict(), "valid": reason is None, "reason": reason}
    if reason is None:
        out.update(cost(model, tok, gpu_id, layout, gpus_per_node, kernel=kernel, fsdp=fsdp,
                        released=released, residency=residency, steps=steps,
                        parallel_vae=parallel_vae))
    return out


@dataclass(frozen=True)
class Plan:
    """What `plan()` answers: the question it was asked (model, GPUs, steps, kernel, tokens, how
    the pipeline holds memory), `best`, the chosen layout costed (`cost_layout`: layout, valid,
    reason and `cpcourse.planner.deployment.cost`'s seconds and bytes), and `reasoning`, the
    lines that explain it. When the planner searched (no layout given) it also names the `tie`
    (layouts within 2%), the `runners_up` with why each lost, the `invalid` layouts with why,
    and every valid layout costed (`alternatives`, fastest first); for a given layout these are
    None. `as_dict()` is what `cpcourse plan --json` prints, and `plan[key]` reads that dict."""

    model: str
    gpu: str
    gpus: int
    nodes: int
    steps: int
    kernel: str
    tokens: TokenCount
    hbm_bytes: int
    fsdp: bool
    released: bool
    best: dict
    reasoning: list[str]
    tie: list[dict] | None = None
    runners_up: list[dict] | None = None
    invalid: list[dict] | None = None
    alternatives: list[dict] | None = None

    @property
    def layout(self) -> Layout:
        return Layout(**self.best["layout"])

    @property
    def searched(self) -> bool:
        """Whether the planner chose the layout (False: it costed the one it was given)."""
        return self.tie is not None

    def as_dict(self) -> dict:
        head = {"model": self.model, "gpu": self.gpu, "gpus": self.gpus, "nodes": self.nodes,
                "steps": self.steps, "kernel": self.kernel, "tokens": self.tokens.as_dict(),
                "sequence_length": self.tokens.sequence_length, "hbm_bytes": self.hbm_bytes,
                "fsdp": self.fsdp, "released": self.released}
        search = {"tie": self.tie, "runners_up": self.runners_up, "invalid": self.invalid,
                  "alternatives": self.alternatives} if self.searched else {}
        return {**head, **self.best, **search, "reasoning": self.reasoning}

    def __getitem__(self, key: str):
        return self.as_dict()[key]


def _why(best: dict, other: dict) -> str:
    """The term that costs `other` the most against `best`, per step."""
    a, b = best["breakdown"]["per_forward_seconds"], other["breakdown"]["per_forward_seconds"]
    fa, fb = best["forwards_per_step"], other["forwards_per_step"]
    diffs = {k: fb * b.get(k, 0.0) - fa * a.get(k, 0.0) for k in {**a, **b}}
    if not other["fits"] and best["fits"]:
        return "does not fit in the GPU's memory"
    term = max(diffs, key=diffs.get)
    return f"{term} costs {diffs[term]:+.3g} s per step more"


def plan(model_id: str, height: int | None = None, width: int | None = None,
         frames: int | None = None, gpus: int = 8, gpu: str = "h100", nodes: int = 1, *,
         steps: int | None = None, kernel: str = "auto", layout=None,
         fsdp: bool = False, released: bool = False, offload: bool = False,
         text_encoder_cpu: bool = False, text_encoder: str | None = None,
         parallel_vae: bool = False) -> Plan:
    """The best layout (or `layout`, costed) for `model_id` on `gpus` GPUs over `nodes` nodes
    (`cpcourse.planner.validation.track_record` says how far off such answers were). `released`,
    `offload`, `text_encoder_cpu` and `text_encoder` (its place: resident, freed, cpu, own-gpu;
    None: as the other two imply) say how the pipeline holds its memory
    (`cpcourse.planner.pipeline_memory`); `parallel_vae` splits the decode over the GPUs
    (`cpcourse.planner.parallel_vae`)."""
    m = get_model(model_id)
    for name, flag in (("fsdp", fsdp), ("released", released), ("offload", offload),
                       ("text_encoder_cpu", text_encoder_cpu), ("parallel_vae", parallel_vae)):
        require(isinstance(flag, bool), f"{name} must be True or False, got {flag!r}")
    require(not released or m.released_dtypes is not None, f"released: no released dtypes "
            f"are recorded for {m.id}, so the plan would be the bf16 one: drop released")
    tok = model_tokens(model_id, height, width, frames)
    _refuse_no_effect(m, tok, released, offload, text_encoder_cpu, text_encoder)
    gpus, nodes, steps = _checked_counts(gpus, nodes, steps)
    g = get_gpu(gpu)
    assumed = kernel == "auto"
    kernel = _checked_kernel(g, kernel)
    per_node = gpus // nodes
    args = (m, tok, g.id)
    head = {"model": m.id, "gpu": g.id, "gpus": gpus, "nodes": nodes, "steps": steps,
            "kernel": kernel, "tokens": tok, "hbm_bytes": g.hbm_bytes, "fsdp": bool(fsdp),
            "released": bool(released)}
    how = {"released": released, "parallel_vae": bool(parallel_vae),
           "residency": Residency(offload, text_encoder_cpu, text_encoder)}
    if parallel_vae:
        check_splittable(m)
    if layout is not None:
        require(isinstance(layout, str | Layout), f"layout must be a Layout or a string like "
                f"'ring=2,ulysses=4', got {layout!r}")
        lay = Layout.parse(layout, attn2d=True) if isinstance(layout, str) else layout
        if lay.world != gpus:
            raise InputError(f"layout {lay} needs {lay.world} GPUs, not gpus={gpus}: the "
                             "degrees must multiply to the GPU count")
        one = _with_interval(cost_layout(*args, lay, per_node, kernel, fsdp, steps, **how),
                             args, lay, per_node, kernel, fsdp, steps, how)
        why = [one["reason"]] if one["reason"] else [f"{lay}: costed as given",
                                                     *_grid_lines(m, tok, one),
                                                     _memory_line(one, g), *_once_lines(one)]
        return Plan(**head, best=one, reasoning=why)
    every = [cost_layout(*args, lay, per_node, kernel, fsdp, steps, **how)
             for lay in _searched(gpus, m)]
    valid = [c for c in every if c["valid"]]
    if not valid:
        raise InputError(f"no layout of {gpus} GPUs is valid for {m.id}: "
                         + "; ".join(sorted({c["reason"] for c in every})))
    pool = [c for c in valid if c["fits"]] or valid
    ranked = sorted(pool, key=lambda c: c["seconds_total"])
    best = _with_interval(ranked[0], args, Layout(**ranked[0]["layout"]), per_node, kernel,
                          fsdp, steps, how)
    tie = [c for c in ranked[1:] if c["seconds_total"] <= best["seconds_total"] * (1 + TIE)]
    runners = [{"layout": c["layout"], "seconds_total": c["seconds_total"],
                "why_not": _why(best, c)} for c in ranked[1 + len(tie):4 + len(tie)]]
    reasons = _reasons(m, tok, g, best, tie, pool is valid)
    if assumed:
        reasons.append(_kernel_line(g, kernel, lambda k: cost_layout(
            *args, Layout(**best["layout"]), per_node, k, fsdp, steps, **how)["seconds_total"],
            best["seconds_total"]))
    return Plan(**head, best=best, reasoning=reasons, tie=[c["layout"] for c in tie],
                runners_up=runners,
                invalid=[{"layout": c["layout"], "reason": c["reason"]} for c in every
                         if not c["valid"]],
                alternatives=sorted(valid, key=lambda c: c["seconds_total"]))


def _with_interval(c: dict, args, lay: Layout, per_node: int, kernel: str, fsdp: bool,
                   steps: int, how: dict) -> dict:
    """`c` (a valid costed layout) with `seconds_total_interval`: [lo, hi] seconds with every
    uncertain input at its fast and its slow end (`cpcourse.planner.uncertainty`), and
    `interval_inputs`, each input's range and source."""
    if not c["valid"]:
        return c
    lo, hi = interval(lambda: cost_layout(*args, lay, per_node, kernel, fsdp, steps,
                                          **how)["seconds_total"])
    return {**c, "seconds_total_interval": [min(lo, c["seconds_total"]),
                                            max(hi, c["seconds_total"])],
            "interval_inputs": interval_sources()}


def _kernel_line(g, kernel: str, price, seconds: float) -> str:
    """Which kernel an `auto` plan assumed, and what the kernel a current engine runs on this
    GPU's generation (`hardware.generation_kernel`) would give instead: the two assumptions
    side by side, neither chosen by what the published runs show."""
    gen, source = generation_kernel(g.id)
    head = f"Kernel assumed: {kernel} (the default, `hardware.default_kernel`)"
    if gen == kernel or kernel_efficiency(g.id, gen)[0] is None:
        return head + "; a current engine on this generation runs the same."
    return (head + f"; a current engine on {g.arch} runs {gen} ({source.split(';')[0]}): "
            f"{price(gen):.0f} s instead of {seconds:.0f} s.")


def _refuse_no_effect(m, tok, released, offload, text_encoder_cpu, text_encoder) -> None:
    """A pipeline flag that cannot change this model's plan is refused, saying why: released
    dtypes that are the default bf16, a text-encoder place for a model with no encoder size,
    offloading where neither the encoder nor the decode's working set is counted."""
    if released and m.released_dtypes[0] == (BF16, BF16, BF16):
        raise InputError(f"released: {m.id}'s released code runs in bf16 throughout "
                         f"({m.released_dtypes[1]}), which is the default: released changes "
                         "nothing; drop it")
    if m.text_encoder:
        return
    moved = text_encoder_cpu or text_encoder not in (None, "resident")
    require(not moved, f"text_encoder: {m.id} has no text-encoder size in the facts, so the "
            "planner counts no encoder and where it lives has no effect: leave `text_encoder` "
            "and `text_encoder_cpu` out")
    require(not offload or decode_working_bytes(m, tok, BF16) is not None, f"offload: {m.id} "
            "has no text-encoder size and no decode working set in the facts, so the decode "
            "never outgrows the denoise and offloading has no effect: drop offload")


def _searched(gpus: int, m) -> list[Layout]:
    """Every layout of the GPUs, and each whose CP ring has 4 or more ranks once more per
    Attention2D grid of them (`with_attn2d`): where the ring is long, the grid moves less."""
    found = layouts(gpus, None, cfg=m.cfg_forwards >= 2)
    return found + [g for lay in found if lay.ring >= 4 for g in with_attn2d(lay)]


def _checked_counts(gpus, nodes, steps) -> tuple[int, int, int]:
    """`plan`'s GPU, node and step counts, or an InputError naming the one to change."""
    gpus, nodes = positive_int("gpus", gpus), positive_int("nodes", nodes)
    require(gpus <= MAX_WORLD, f"gpus {gpus}: the planner lays out at most {MAX_WORLD} "
            f"GPUs: use {MAX_WORLD} or fewer")
    require(gpus % nodes == 0, f"gpus {gpus} do not split evenly over nodes={nodes}")
    steps = positive_int("steps", 50 if steps is None else steps)
    require(steps <= 10000, f"steps {steps}: use at most 10000")
    return gpus, nodes, steps


def _checked_kernel(g, kernel: str) -> str:
    """The attention kernel `plan` prices on GPU `g` ("auto": its default), checked."""
    kernel = default_kernel(g.id) if kernel == "auto" else kernel
    require(kernel in KERNELS, f"kernel must be auto or one of {', '.join(KERNELS)}, got "
            f"{kernel!r}")
    eff, _ = kernel_efficiency(g.id, kernel)
    require(eff is not None, f"kernel {kernel} has no published rate on {g.arch} GPUs like the "
            f"{g.name}: use fa2 or sdpa (`cpcourse.planner.hardware.kernel_efficiency` says why)")
    return kernel


def _memory_line(c: dict, g) -> str:
    """Per GPU at the peak, which phase it is and what it holds
    (`cpcourse.planner.pipeline_memory`)."""
    ph = c["breakdown"]["memory_phases"]
    peak = max(ph, key=ph.get)
    names = {"loop": "activations and buffers"}
    held = ", ".join(f"{names.get(k, k.replace('_', ' '))} {b / 1e9:.1f}"
                     for k, b in c["breakdown"]["memory_phase_parts"][peak].items())
    return (f"Per GPU: {c['per_gpu_bytes'] / 1e9:.1f} GB of {g.hbm_gb:g} GB at the peak, the "
            f"{peak} phase ({held}).")


def _reasons(m, tok, g, best: dict, tie: list, none_fit: bool) -> list[str]:
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
    out += _grid_lines(m, tok, best)
    out.append(_memory_line(best, g)
               + (" Nothing fits: add GPUs, TP or FSDP, or offload." if none_fit else ""))
    return out + _once_lines(best)


def _once_lines(c: dict) -> list[str]:
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


def _grid_lines(m, tok, best: dict) -> list[str]:
    """When the CP axis is long (4+ ranks): ring or Attention2D, which won and why. The ring's
    bytes per rank stay ~2x the sequence's K/V whatever R; the grid's fall as 1/sqrt(R), but
    the grid cannot hide them behind compute, so it wins where few heads are left for Ulysses
    (a long CP axis) and that axis sits in one NVLink domain."""
    from cpcourse.planner.costs import tiling_bytes_per_rank

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
