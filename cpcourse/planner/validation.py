"""Check the planner against published runs: each run predicted as it was made, the error per
run, per table the speedup and the serial part, and the published peaks beside the predicted.

    cpcourse plan --validate --json

`validate()` predicts every run of the facts' published_runs.json (the validation set) and,
apart, xDiT's second table (`holdout`: found later, but not held out, `NOT_HELD_OUT`), and per
source (`by_source`) the errors and how many published times fall inside the plan's interval;
`leave_one_source_out` says what that means for a planner with nothing fitted.
`how_run` says how a run was made
where its source says so (data/published_runs_settings.json: FSDP, offloading, the text encoder
on the CPU, the released code's dtypes). `amdahl_fit` splits a table's times into the part that
did not shrink with the GPUs and the part that did. `track_record` is how far off the model was
on the published runs nearest to a plan (`cpcourse plan` prints it under every answer).
"""

from __future__ import annotations

import statistics

from cpcourse.planner.facts import (
    added_runs,
    gpu_measured,
    holdout_runs,
    published_runs,
    published_runs_settings,
    run_provenance,
)
from cpcourse.planner.hardware import get_gpu
from cpcourse.planner.plan import plan
from cpcourse.planner.tokens import get_model
from cpcourse.support.errors import positive_float, positive_int, require
from cpcourse.support.layout import Layout, layouts


def amdahl_fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(s, w) of the least-squares fit t = s + w / P to (P, seconds) points of one table: the
    part of a run that did not shrink with the GPUs, and the part that did. What published
    times imply, measured nowhere; with two points it is the exact split."""
    require(isinstance(points, list | tuple) and all(
        isinstance(pt, list | tuple) and len(pt) == 2 for pt in points),
        f"points must be (GPUs, seconds) pairs, got {points!r}")
    # 1 / 0 GPUs, or a NaN time, would come back as a fit of NaN or a ZeroDivisionError
    points = [(positive_int(f"points[{i}] GPUs", p), positive_float(f"points[{i}] seconds", t))
              for i, (p, t) in enumerate(points)]
    require(len({p for p, _ in points}) >= 2,
            "two GPU counts are needed to split a time into a serial and a parallel part")
    xs, ts = [1 / p for p, _ in points], [t for _, t in points]
    mx, mt = statistics.fmean(xs), statistics.fmean(ts)
    cov = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True))
    w = cov / sum((x - mx) ** 2 for x in xs)
    return mt - w * mx, w


def how_run(run: dict) -> dict:
    """How a published run was made (data/published_runs_settings.json, each rule sourced):
    {released, fsdp, offload, text_encoder_cpu, source}; the planner's defaults where no rule
    covers it."""
    many = run["gpus"] > 1
    for rule in published_runs_settings():
        if rule["model"] == run["model"] and (rule["gpus"] == "2+") == many:
            return {k: rule[k] for k in ("released", "fsdp", "offload", "text_encoder_cpu",
                                         "source")}
    return {"released": False, "fsdp": False, "offload": False, "text_encoder_cpu": False,
            "source": None}


def _kernel(run: dict) -> str:
    """The kernel a run names, else "auto" (the planner's default, which it then names)."""
    k = run.get("kernel")
    return "auto" if k in (None, "unknown") else k


def candidate_layouts(run: dict) -> list[Layout]:
    """The layouts a published run may have used: its source's, or, where the source does not
    give it (`layout` null), every Ulysses x ring layout of its GPU count that the model's heads
    allow (the released scripts of these runs have no CFG-parallel or TP flag)."""
    if run["layout"] is not None:
        return [Layout(**run["layout"])]
    heads = get_model(run["model"]).heads
    return [lay for lay in layouts(run["gpus"], heads, cfg=False) if lay.tp == 1]


# What a published time includes where its source does not say part by part: the sources time
# a whole generate call (xDiT's page and Wan's README report one "latency" or "time" per video),
# so the text encoder, the denoising loop and the VAE decode, not the model's load.
INCLUDES = ("text_encoder", "denoise", "vae_decode")


# data/published_runs_provenance.json's names for the parts of a generation -> the planner's
_PARTS = {"text_encode": "text_encoder", "denoise": "denoise", "vae_decode": "vae_decode",
          "first_call_warmup": "warmup", "model_load": "load"}


def _provenance(run: dict) -> dict:
    return run_provenance()["tables"].get(run.get("table"), {})


def source_id(run: dict) -> str:
    """The source a published run comes from (its table's `source_id` in
    data/published_runs_provenance.json, else the run's own, else the repository its source
    names first): what leave-one-source-out groups by."""
    return (_provenance(run).get("source_id") or run.get("source_id")
            or run["source"].split()[0])


def included(run: dict) -> list[str]:
    """The parts of a pipeline a run's published time includes: its table's `includes` in
    data/published_runs_provenance.json (a part not stated, null, is taken as included: the
    sources time a whole generate call), else the run's own list, else `INCLUDES`."""
    prov = _provenance(run).get("includes")
    if isinstance(run.get("includes"), dict):  # an added run carries its own, as the provenance
        prov = run["includes"]
    if prov is not None and not isinstance(run.get("includes"), list):
        return [_PARTS[k] for k, on in prov.items() if on is not False and k in _PARTS]
    parts = run.get("includes") or list(INCLUDES)
    require(set(parts) <= {*INCLUDES, "warmup", "load"}, f"includes: unknown parts in {parts}")
    return list(parts)


def warmup_share() -> tuple[float, str]:
    """(extra share of one forward that the first call at a shape takes, source): cuDNN and
    cuBLAS planning, allocations. From the one model the H200 run timed twice (Wan 1.3B at
    480p: first / second forward - 1); the larger models were timed once."""
    for run in gpu_measured().values():
        for m in run.get("models", []):
            if len(m.get("seconds_all", [])) >= 2:
                first, *rest = m["seconds_all"]
                return first / min(rest) - 1, (f"{m['model']} on one {run['provenance']['gpu']}: "
                                               f"first forward {first:.3f} s, then "
                                               f"{min(rest):.3f} s")
    return 0.0, "no forward timed twice"


def _left_out(costed: dict, parts: list[str]) -> float:
    """Seconds of a costed plan that a published time does not include (decode, encoder), less
    the first call's warm-up where it does include it (a negative amount left out)."""
    out = 0.0
    if "warmup" in parts:
        per = costed["breakdown"]["per_forward_seconds"]
        out -= warmup_share()[0] * sum(per.values())
    if "vae_decode" not in parts:
        out += costed["vae_decode_seconds"] or 0.0
    if "text_encoder" not in parts:
        out += costed["text_encoder"]["seconds"] or 0.0
    return out


def predict_runs(runs: list[dict]) -> dict:
    """Each run predicted as it was made (`how_run`) with its own layout, GPU and steps: rows
    with the ratio, the median and worst |ratio - 1|, per table the speedup from its fewest to
    its most GPUs beside the serial part its published times imply (`amdahl_fit`) and the one
    the model charges (its fixed costs); and, where a run's peak memory is published, the
    predicted peak against it ("memory"). A run whose source gives no layout is predicted with
    the fastest of its `candidate_layouts` (a published speed is read as the best its authors
    found); `layout_sourced` is then False and `predicted_range_s` spans them all."""
    rows = []
    for r in runs:
        how = how_run(r)
        costed = [plan(r["model"], r["height"], r["width"], r["frames"], r["gpus"], r["gpu"],
                       steps=r["steps"], kernel=_kernel(r), fsdp=how["fsdp"],
                       released=how["released"], offload=how["offload"],
                       text_encoder_cpu=how["text_encoder_cpu"], layout=lay).best
                  for lay in candidate_layouts(r)]
        parts = included(r)
        secs = [c["seconds_total"] - _left_out(c, parts) for c in costed]
        p = costed[secs.index(min(secs))]
        left_out = _left_out(p, parts)
        lo = min(c["seconds_total_interval"][0] - _left_out(c, parts) for c in costed)
        hi = p["seconds_total_interval"][1] - left_out
        peak = r.get("peak_GB")  # GB as published, read as 1e9 bytes
        rows.append({"table": r["table"], "model": r["model"], "gpu": r["gpu"],
                     "gpus": r["gpus"], "layout": p["layout"],
                     "layout_sourced": r["layout"] is not None,
                     "predicted_range_s": (min(secs), max(secs)),
                     "published_s": r["seconds_total"],
                     "predicted_s": p["seconds_total"] - left_out,
                     "ratio": (p["seconds_total"] - left_out) / r["seconds_total"],
                     "interval_s": [lo, hi], "covered": lo <= r["seconds_total"] <= hi,
                     "includes": parts, "source_id": source_id(r), "kernel": p["kernel"],
                     "kernel_stated": _provenance(r).get("kernel", r.get("kernel") or "unknown"),
                     "held_out": bool(_provenance(r).get("held_out", r.get("held_out", False))),
                     "fsdp": how["fsdp"], "how": how, "fixed_s": p["seconds_fixed"],
                     "published_peak_bytes": peak * 1e9 if peak else None,
                     "predicted_peak_bytes": p["per_gpu_bytes"],
                     "memory_ratio": p["per_gpu_bytes"] / (peak * 1e9) if peak else None,
                     "notes": r.get("notes")})
    errors = [abs(row["ratio"] - 1) for row in rows]
    covered = sum(row["covered"] for row in rows)
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
            "interval_coverage": covered / len(rows),
            "memory": {"runs": len(mem), "median_abs_rel_error": statistics.median(mem)
                       if mem else None, "worst_abs_rel_error": max(mem) if mem else None}}


def validate() -> dict:
    """Predict every published run of the validation set (`published_runs`), and separately
    xDiT's second table (`holdout_runs`, key "holdout", the same fields; not held out), the
    errors per source (`by_source`), and interval coverage: the ratio per row, the
    median and worst |ratio - 1|, and per table the speedup from its fewest to its most GPUs,
    predicted against published."""
    held, added = holdout_runs(), added_runs()
    main, second = predict_runs(published_runs()["runs"]), predict_runs(held["runs"])
    new = predict_runs(added["runs"])
    return {**main, "about": published_runs()["about"],
            "holdout": {**second, "about": held["about"], "held_out": False,
                        "why_not_held_out": NOT_HELD_OUT},
            "added": {**new, "about": added["about"],
                      "held_out": all(r.get("held_out") for r in added["runs"])},
            "by_source": by_source(main["rows"] + second["rows"] + new["rows"]),
            "leave_one_source_out": LOSO}


# What "leave-one-source-out" means for a planner with nothing fitted, said where it is reported.
LOSO = ("Each source's runs are predicted with no number read from that source: the planner "
        "reads no published run at all (its rates are datasheets, papers, kernel benchmarks, "
        "the course's own H200 measurement and timed VAE decodes; none is a validation run), so "
        "leaving a source out changes no prediction. What it cannot undo: choices made while "
        "these errors were visible (FA2 as the default kernel, FA4 in its place on Blackwell after "
        "TensorRT-LLM blog 28's run, the RTX 4090 box's link without P2P, the fastest candidate "
        "where a source gives no layout).")
NOT_HELD_OUT = ("Not held out: xDiT's 960x960 table is from the same page, GPUs and code as the "
                "720p validation table, with the same token count, and the planner changed after "
                "it was read. It is reported as a second table of that source.")


def by_source(rows: list[dict]) -> dict:
    """Per source (`source_id`): runs, median and worst |ratio - 1|, signed median, and the
    share of its published times inside the plan's interval."""
    out: dict[str, dict] = {}
    for sid in sorted({r["source_id"] for r in rows}):
        rs = [r for r in rows if r["source_id"] == sid]
        errs = [abs(r["ratio"] - 1) for r in rs]
        worst = max(rs, key=lambda r: abs(r["ratio"] - 1))
        out[sid] = {"runs": len(rs), "median_abs_rel_error": statistics.median(errs),
                    "worst_abs_rel_error": max(errs),
                    "worst_run": f"{worst['table']} x{worst['gpus']}",
                    "signed_median": statistics.median(r["ratio"] - 1 for r in rs),
                    "interval_coverage": sum(r["covered"] for r in rs) / len(rs)}
    return out


def track_record(model_id: str, gpu_id: str) -> dict:
    """How far off the model was on the published runs nearest to a plan: those of this model
    on this GPU, else of this model on any GPU (both tables of each source alike). Not a
    correction (nothing here changes a prediction): the error bars an engineer reads beside
    one. Keys: scope, tables, runs, ratio_min, ratio_max (predicted / published), speedups
    (per table: published, predicted) and serial (per table: implied by the runs, charged by
    the model, in seconds)."""
    # an unknown id (a typo) would otherwise read as "no published run of this model"
    model_id, gpu_id = get_model(model_id).id, get_gpu(gpu_id).id
    v = validate()
    rows = v["rows"] + v["holdout"]["rows"]
    speedups = {**v["speedups"], **v["holdout"]["speedups"]}
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
