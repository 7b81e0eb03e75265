"""Plan a cfg x ring x ulysses x tp layout for a real model on N GPUs, and check the planner
against published runs.

    cpcourse plan --model hunyuanvideo-13b --height 720 --width 1280 --frames 129 --gpus 8
    cpcourse plan --model wan2.1-t2v-14b --gpus 8 --gpu h800 --layout ulysses=8 --json
    cpcourse plan --validate --json

Every layout of the GPUs (`cpcourse.mesh.layouts`) is checked against the model's rules (heads
divisible by ulysses x tp, one forward per step for a guidance-distilled model, HunyuanVideo's
split of the latent height or else width) and costed by `cpcourse.deployment.cost`. The fastest
valid layout that fits wins; layouts within 2% of it are named as a tie, never explained as a
reasoned choice. `validate()` predicts every run of the facts' published_runs.json.
"""

from __future__ import annotations

import json
import statistics
from functools import lru_cache
from importlib import resources

from cpcourse.costs import MAX_GPUS
from cpcourse.deployment import cost
from cpcourse.hardware import KERNELS, get_gpu, kernel_efficiency
from cpcourse.mesh import Layout, layouts
from cpcourse.pipeline_memory import RESIDENT, Residency
from cpcourse.support.errors import InputError, positive_int, require
from cpcourse.tokens import get_model, holdout_runs, model_tokens, published_runs

TIE = 0.02  # layouts within 2% of the best are a tie: the model is not that precise


def auto_kernel(gpu_id: str) -> str:
    """The kernel a model's released code installs (flash-attn 2 in Wan's and HunyuanVideo's
    requirements), unless it cannot run on the GPU: then PyTorch's SDPA."""
    return "fa2" if kernel_efficiency(gpu_id, "fa2")[0] else "sdpa"


def validity(model_id: str, tok, layout: Layout) -> str | None:
    """Why the model cannot run this layout, or None."""
    m = get_model(model_id)
    if layout.cfg == 2 and m.cfg_forwards == 1:
        return f"{m.name} is guidance-distilled (one forward per step): there is no CFG pair"
    if m.heads % (layout.ulysses * layout.tp):
        return (f"ulysses x tp = {layout.ulysses * layout.tp} does not divide the {m.heads} "
                "heads")
    sp = layout.cp
    if sp > tok.sequence_length:
        return f"{sp} CP ranks for {tok.sequence_length} tokens"
    if model_id.startswith("hunyuanvideo") and sp > 1:
        rows, cols = tok.latent_height // 2, tok.latent_width // 2
        if rows % sp and cols % sp:
            return (f"HunyuanVideo splits the latent height ({rows} token rows) or else the width "
                    f"({cols} columns) over its {sp} sequence-parallel ranks: neither divides "
                    "(hyvideo/inference.py)")
    return None


def _legacy(c: dict) -> dict:
    """The keys the first planner returned, kept for its callers."""
    lay = c["layout"]
    per = c["breakdown"]["per_forward_seconds"]
    layers = c["layers"]
    return {"cfg_parallel": lay["cfg"], "tp": lay["tp"], "cp": lay["ring"] * lay["ulysses"],
            "ulysses": lay["ulysses"], "ring": lay["ring"], "ring_link": c["links"]["ring"],
            "seconds_per_layer": {"attention": per["attention"] / layers,
                                  "linear": per["linear"] / layers,
                                  "ring_exposed": per["ring_exposed"] / layers,
                                  "ulysses": per["ulysses"] / layers,
                                  "tp": per["tp_allreduce"] / layers}}


def cost_layout(model_id: str, tok, gpu_id: str, layout: Layout, gpus_per_node: int,
                kernel: str, fsdp: bool, steps: int, released: bool = False,
                residency: Residency = RESIDENT) -> dict:
    """One layout: valid, reason, and (when valid) its costs."""
    reason = validity(model_id, tok, layout)
    out = {"layout": layout.as_dict(), "valid": reason is None, "reason": reason}
    if reason is None:
        c = cost(model_id, tok, gpu_id, layout, gpus_per_node, kernel=kernel, fsdp=fsdp,
                 released=released, residency=residency,
                 steps=steps)
        c["layers"] = get_model(model_id).layers
        out.update(c)
        out.update(_legacy(c))
        out.pop("layers")
    return out


def _why(best: dict, other: dict) -> str:
    """The term that costs `other` the most against `best`, per step."""
    a, b = best["breakdown"]["per_forward_seconds"], other["breakdown"]["per_forward_seconds"]
    fa, fb = best["forwards_per_step"], other["forwards_per_step"]
    diffs = {k: fb * b[k] - fa * a[k] for k in a}
    if not other["fits"] and best["fits"]:
        return "does not fit in the GPU's memory"
    term = max(diffs, key=diffs.get)
    return f"{term} costs {diffs[term]:+.3g} s per step more"


def plan(model_id: str, height: int | None = None, width: int | None = None,
         frames: int | None = None, gpus: int = 8, gpu: str = "h100", nodes: int = 1, *,
         steps: int | None = None, kernel: str = "auto", layout=None,
         fsdp: bool = False, released: bool = False, offload: bool = False,
         text_encoder_cpu: bool = False, track: bool = True) -> dict:
    """The best layout (or `layout`, costed) for `model_id` on `gpus` GPUs over `nodes` nodes,
    with (`track`) the model's `track_record` on the published runs nearest to it. `released`,
    `offload` and `text_encoder_cpu` say how the pipeline holds its memory
    (`cpcourse.pipeline_memory`)."""
    m = get_model(model_id)
    tok = model_tokens(model_id, height, width, frames)
    gpus, nodes = positive_int("--gpus", gpus), positive_int("--nodes", nodes)
    require(gpus <= MAX_GPUS, f"--gpus {gpus} is more GPUs than any cluster has: "
            f"use {MAX_GPUS} or fewer")
    require(gpus % nodes == 0, f"--gpus {gpus} do not split evenly over --nodes {nodes}")
    steps = positive_int("--steps", 50 if steps is None else steps)
    require(steps <= 10000, f"--steps {steps}: use at most 10000")
    g = get_gpu(gpu)
    kernel = auto_kernel(g.id) if kernel == "auto" else kernel
    require(kernel in KERNELS, f"--kernel must be auto or one of {', '.join(KERNELS)}, got "
            f"{kernel!r}")
    eff, _ = kernel_efficiency(g.id, kernel)
    require(eff is not None, f"--kernel {kernel} has no published rate on {g.arch} GPUs like the "
            f"{g.name}: use fa2 or sdpa (`cpcourse.hardware.kernel_efficiency` says why)")
    per_node = gpus // nodes
    args = (model_id, tok, g.id)
    head = {"model": m.id, "gpu": g.id, "gpus": gpus, "nodes": nodes, "steps": steps,
            "kernel": kernel, "tokens": tok.as_dict(), "sequence_length": tok.sequence_length,
            "hbm_bytes": g.hbm_bytes, "fsdp": bool(fsdp), "released": bool(released)}
    how = {"released": released, "residency": Residency(offload, text_encoder_cpu)}
    if track:
        head["track_record"] = track_record(m.id, g.id)
    if layout is not None:
        lay = Layout.parse(layout) if isinstance(layout, str) else layout
        if lay.world != gpus:
            raise InputError(f"--layout {lay} needs {lay.world} GPUs, not --gpus {gpus}: the "
                             "degrees must multiply to the GPU count")
        one = cost_layout(*args, lay, per_node, kernel, fsdp, steps, **how)
        why = [one["reason"]] if one["reason"] else [f"{lay}: costed as given",
                                                     _memory_line(one, g)]
        return {**head, **one, "reasoning": why}
    every = [cost_layout(*args, lay, per_node, kernel, fsdp, steps, **how)
             for lay in layouts(gpus, None, cfg=m.cfg_forwards == 2)]
    valid = [c for c in every if c["valid"]]
    if not valid:
        raise InputError(f"no layout of {gpus} GPUs is valid for {m.id}: "
                         + "; ".join(sorted({c["reason"] for c in every})))
    pool = [c for c in valid if c["fits"]] or valid
    ranked = sorted(pool, key=lambda c: c["seconds_total"])
    best = ranked[0]
    tie = [c for c in ranked[1:] if c["seconds_total"] <= best["seconds_total"] * (1 + TIE)]
    runners = [{"layout": c["layout"], "seconds_total": c["seconds_total"],
                "why_not": _why(best, c)} for c in ranked[1 + len(tie):4 + len(tie)]]
    reasons = _reasons(m, tok, g, best, tie, pool is valid)
    return {**head, **best, "tie": [c["layout"] for c in tie], "runners_up": runners,
            "invalid": [{"layout": c["layout"], "reason": c["reason"]} for c in every
                        if not c["valid"]],
            "alternatives": sorted(valid, key=lambda c: c["seconds_total"]),
            "reasoning": reasons}


def _memory_line(c: dict, g) -> str:
    """Per GPU at the peak, which phase it is and what it holds (`cpcourse.pipeline_memory`)."""
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
    pair = "one forward per step (guidance-distilled)" if m.cfg_forwards == 1 else \
        "a CFG pair per step"
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
    comm = {k: per[k] for k in ("ulysses", "ring_exposed", "tp_allreduce", "fsdp_exposed")}
    top = max(comm, key=comm.get)
    out.append(f"Largest communication term: {top} {comm[top]:.3g} s per forward"
               + (f" over {best['links'][top.split('_')[0]]}" if best["links"].get(
                   top.split("_")[0]) else "") + ".")
    out.append(_memory_line(best, g)
               + (" Nothing fits: add GPUs, TP or FSDP, or offload." if none_fit else ""))
    return out


def amdahl_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(s, w) of the least-squares fit t = s + w / P to (P, seconds) points of one table: the
    part of a run that did not shrink with the GPUs, and the part that did. What published
    times imply, measured nowhere; with two points it is the exact split."""
    require(len({p for p, _ in points}) >= 2,
            "two GPU counts are needed to split a time into a serial and a parallel part")
    xs, ts = [1 / p for p, _ in points], [t for _, t in points]
    mx, mt = statistics.fmean(xs), statistics.fmean(ts)
    cov = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True))
    w = cov / sum((x - mx) ** 2 for x in xs)
    return mt - w * mx, w


@lru_cache(maxsize=1)
def _settings_rules() -> list[dict]:
    rules = json.loads(resources.files("cpcourse").joinpath(
        "data/published_runs_settings.json").read_text())["rules"]
    for rule in rules:
        require(rule["gpus"] in ("1", "2+"), f"published_runs_settings.json: a rule's gpus is "
                f"'1' or '2+', not {rule['gpus']!r}")
    return rules


def how_run(run: dict) -> dict:
    """How a published run was made (data/published_runs_settings.json, each rule sourced):
    {released, fsdp, offload, text_encoder_cpu, source}; the planner's defaults where no rule
    covers it."""
    many = run["gpus"] > 1
    for rule in _settings_rules():
        if rule["model"] == run["model"] and (rule["gpus"] == "2+") == many:
            return {k: rule[k] for k in ("released", "fsdp", "offload", "text_encoder_cpu",
                                         "source")}
    return {"released": False, "fsdp": False, "offload": False, "text_encoder_cpu": False,
            "source": None}


def _predict(runs: list[dict]) -> dict:
    """Each run predicted as it was made (`how_run`) with its own layout, GPU and steps: rows
    with the ratio, the median and worst |ratio - 1|, per table the speedup from its fewest to
    its most GPUs beside the serial part its published times imply (`amdahl_fit`) and the one
    the model charges (its fixed costs); and, where a run's peak memory is published, the
    predicted peak against it ("memory")."""
    rows = []
    for r in runs:
        how = how_run(r)
        p = plan(r["model"], r["height"], r["width"], r["frames"], r["gpus"], r["gpu"],
                 steps=r["steps"], kernel=r.get("kernel") or "auto", fsdp=how["fsdp"],
                 released=how["released"], offload=how["offload"],
                 text_encoder_cpu=how["text_encoder_cpu"], layout=Layout(**r["layout"]),
                 track=False)
        peak = r.get("peak_GB")  # GB as published, read as 1e9 bytes
        rows.append({"table": r["table"], "model": r["model"], "gpu": r["gpu"],
                     "gpus": r["gpus"], "layout": r["layout"],
                     "published_s": r["seconds_total"], "predicted_s": p["seconds_total"],
                     "ratio": p["seconds_total"] / r["seconds_total"], "kernel": p["kernel"],
                     "fsdp": how["fsdp"], "how": how, "fixed_s": p["seconds_fixed"],
                     "published_peak_bytes": peak * 1e9 if peak else None,
                     "predicted_peak_bytes": p["per_gpu_bytes"],
                     "memory_ratio": p["per_gpu_bytes"] / (peak * 1e9) if peak else None,
                     "notes": r.get("notes")})
    errors = [abs(row["ratio"] - 1) for row in rows]
    mem = [abs(row["memory_ratio"] - 1) for row in rows if row["memory_ratio"]]
    tables = {}
    for row in rows:
        tables.setdefault(row["table"], []).append(row)
    speedups = {}
    for name, rs in tables.items():
        if len({x["gpus"] for x in rs}) < 2:
            continue  # one GPU count: nothing to scale from
        lo, hi = min(rs, key=lambda x: x["gpus"]), max(rs, key=lambda x: x["gpus"])
        pub, pred = lo["published_s"] / hi["published_s"], lo["predicted_s"] / hi["predicted_s"]
        serial, _ = amdahl_fit([(x["gpus"], x["published_s"]) for x in rs])
        speedups[name] = {"gpus": [lo["gpus"], hi["gpus"]], "published": pub, "predicted": pred,
                          "ratio": pred / pub, "serial_implied_s": serial,
                          "serial_model_s": lo["fixed_s"]}
    return {"rows": rows, "median_abs_rel_error": statistics.median(errors),
            "worst_abs_rel_error": max(errors), "speedups": speedups,
            "memory": {"runs": len(mem), "median_abs_rel_error": statistics.median(mem)
                       if mem else None, "worst_abs_rel_error": max(mem) if mem else None}}


def validate() -> dict:
    """Predict every published run of the validation set (`published_runs`), and separately
    the held-out runs (`holdout_runs`, key "holdout", the same fields): the ratio per row, the
    median and worst |ratio - 1|, and per table the speedup from its fewest to its most GPUs,
    predicted against published."""
    held = holdout_runs()
    return {**_predict(published_runs()["runs"]), "about": published_runs()["about"],
            "holdout": {**_predict(held["runs"]), "about": held["about"]}}


def track_record(model_id: str, gpu_id: str) -> dict:
    """How far off the model was on the published runs nearest to a plan: those of this model
    on this GPU, else of this model on any GPU (validation set and held-out runs alike). Not a
    correction (nothing here changes a prediction): the error bars an engineer reads beside
    one. Keys: scope, tables, runs, ratio_min, ratio_max (predicted / published), speedups
    (per table: published, predicted) and serial (per table: implied by the runs, charged by
    the model, in seconds)."""
    v = validate()
    rows = v["rows"] + v["holdout"]["rows"]
    speedups = {**v["speedups"], **v["holdout"]["speedups"]}
    gpu_id = get_gpu(gpu_id).id
    scope, near = "this model on this GPU", [
        r for r in rows if r["model"] == model_id and get_gpu(r["gpu"]).id == gpu_id]
    if not near:
        scope, near = "this model on other GPUs", [r for r in rows if r["model"] == model_id]
    if not near:
        return {"scope": "no published run of this model", "tables": [], "runs": 0,
                "ratio_min": None, "ratio_max": None, "speedups": {}, "serial": {}}
    tables = sorted({r["table"] for r in near if r["table"] in speedups})
    return {"scope": scope, "tables": tables, "runs": len(near),
            "ratio_min": min(r["ratio"] for r in near),
            "ratio_max": max(r["ratio"] for r in near),
            "speedups": {t: {"gpus": speedups[t]["gpus"], "published": speedups[t]["published"],
                             "predicted": speedups[t]["predicted"]} for t in tables},
            "serial": {t: {"implied_s": speedups[t]["serial_implied_s"],
                           "model_s": speedups[t]["serial_model_s"]} for t in tables}}
