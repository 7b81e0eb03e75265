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

from dataclasses import dataclass, replace

from cpcourse.planner.deployment import cost
from cpcourse.planner.hardware import (
    KERNELS,
    default_kernel,
    get_gpu,
    kernel_efficiency,
)
from cpcourse.planner.parallel_vae import check_splittable
from cpcourse.planner.pipeline_memory import BF16, RESIDENT, Residency, decode_working_bytes
from cpcourse.planner.plan_reasons import (  # noqa: F401 (NOT_COUNTED: re-exported)
    NOT_COUNTED,
    grid_lines,
    kernel_line,
    memory_line,
    once_lines,
    reason_lines,
    why_not,
)
from cpcourse.planner.tokens import ModelPreset, TokenCount, as_preset, get_model, model_tokens
from cpcourse.planner.uncertainty import interval
from cpcourse.planner.uncertainty import sources as interval_sources
from cpcourse.support.errors import InputError, positive_int, require
from cpcourse.support.layout import MAX_WORLD, Layout, layouts, with_attn2d

TIE = 0.02  # layouts within 2% of the best are a tie: the model is not that precise


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


@dataclass(frozen=True)
class Pricing:
    """What every layout of one plan is priced with: GPUs per node, the attention kernel, FSDP,
    the step count and how the pipeline holds its memory (`cpcourse.planner.deployment.cost`'s
    keywords, gathered once so each layout is costed alike)."""

    gpus_per_node: int
    kernel: str
    fsdp: bool
    steps: int
    released: bool = False
    residency: Residency = RESIDENT
    parallel_vae: bool = False


def cost_layout(model: ModelPreset | str, tok, gpu_id: str, layout: Layout,
                pricing: Pricing) -> dict:
    """One layout: valid, reason, and (when valid) its costs."""
    reason = validity(model, tok, layout)
    out = {"layout": layout.as_dict(), "valid": reason is None, "reason": reason}
    if reason is None:
        p = pricing
        out.update(cost(model, tok, gpu_id, layout, p.gpus_per_node, kernel=p.kernel,
                        fsdp=p.fsdp, released=p.released, residency=p.residency, steps=p.steps,
                        parallel_vae=p.parallel_vae))
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
    how = Pricing(per_node, kernel, fsdp, steps, released=released,
                  residency=Residency(offload, text_encoder_cpu, text_encoder),
                  parallel_vae=bool(parallel_vae))
    if parallel_vae:
        check_splittable(m)
    if layout is not None:
        require(isinstance(layout, str | Layout), f"layout must be a Layout or a string like "
                f"'ring=2,ulysses=4', got {layout!r}")
        lay = Layout.parse(layout, attn2d=True) if isinstance(layout, str) else layout
        if lay.world != gpus:
            raise InputError(f"layout {lay} needs {lay.world} GPUs, not gpus={gpus}: the "
                             "degrees must multiply to the GPU count")
        one = _with_interval(cost_layout(*args, lay, how), args, lay, how)
        why = [one["reason"]] if one["reason"] else [f"{lay}: costed as given",
                                                     *grid_lines(m, tok, one),
                                                     memory_line(one, g), *once_lines(one)]
        return Plan(**head, best=one, reasoning=why)
    every = [cost_layout(*args, lay, how) for lay in _searched(gpus, m)]
    valid = [c for c in every if c["valid"]]
    if not valid:
        raise InputError(f"no layout of {gpus} GPUs is valid for {m.id}: "
                         + "; ".join(sorted({c["reason"] for c in every})))
    pool = [c for c in valid if c["fits"]] or valid
    ranked = sorted(pool, key=lambda c: c["seconds_total"])
    best = _with_interval(ranked[0], args, Layout(**ranked[0]["layout"]), how)
    tie = [c for c in ranked[1:] if c["seconds_total"] <= best["seconds_total"] * (1 + TIE)]
    runners = [{"layout": c["layout"], "seconds_total": c["seconds_total"],
                "why_not": why_not(best, c)} for c in ranked[1 + len(tie):4 + len(tie)]]
    reasons = reason_lines(m, tok, g, best, tie, pool is valid)
    if assumed:
        reasons.append(kernel_line(g, kernel, lambda k: cost_layout(
            *args, Layout(**best["layout"]), replace(how, kernel=k))["seconds_total"],
            best["seconds_total"]))
    return Plan(**head, best=best, reasoning=reasons, tie=[c["layout"] for c in tie],
                runners_up=runners,
                invalid=[{"layout": c["layout"], "reason": c["reason"]} for c in every
                         if not c["valid"]],
                alternatives=sorted(valid, key=lambda c: c["seconds_total"]))


def _with_interval(c: dict, args, lay: Layout, how: Pricing) -> dict:
    """`c` (a valid costed layout) with `seconds_total_interval`: [lo, hi] seconds with every
    uncertain input at its fast and its slow end (`cpcourse.planner.uncertainty`), and
    `interval_inputs`, each input's range and source."""
    if not c["valid"]:
        return c
    lo, hi = interval(lambda: cost_layout(*args, lay, how)["seconds_total"])
    return {**c, "seconds_total_interval": [min(lo, c["seconds_total"]),
                                            max(hi, c["seconds_total"])],
            "interval_inputs": interval_sources()}


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

