"""What one GPU measured beside what the planner assumes: the attention kernel's share of peak,
and one forward of real-size models, part by part.

    python -c "from cpcourse.planner.measured import forward_rows; print(forward_rows()[0])"

The measurements are `cpcourse bench gpu`'s, committed with their provenance in
`cpcourse/data/gpu_measured_*.json` (`cpcourse.planner.facts.gpu_measured`); the predictions are
computed here, now, by `cpcourse.planner.deployment.cost`, so a change to the cost model shows
up beside the same measurement. Notebooks 05 and 10 print these rows.
"""

from __future__ import annotations

from cpcourse.planner.deployment import cost
from cpcourse.planner.facts import facts, gpu_measured
from cpcourse.planner.hardware import get_gpu
from cpcourse.planner.tokens import model_tokens
from cpcourse.support.errors import require
from cpcourse.support.layout import Layout

# attention_with_lse's backend -> what it is, and the planner's kernel id for that class
BACKENDS = {"sdpa-flash": ("FlashAttention-2 (SDPA's flash kernel)", "fa2"),
            "sdpa-efficient": ("memory-efficient (SDPA's cutlass kernel)", None),
            "sdpa-cudnn": ("cuDNN fused attention", "fa3"),
            "flash-attn": ("flash-attn package", "fa2")}


def run(gpu_id: str = "h200-sxm") -> dict:
    """The committed results of `cpcourse bench gpu` on that GPU."""
    runs = gpu_measured()
    require(get_gpu(gpu_id).id in runs, f"no GPU measurement for {gpu_id!r}: measured on "
            f"{', '.join(runs)}")
    return runs[get_gpu(gpu_id).id]


def provenance(gpu_id: str = "h200-sxm") -> str:
    """One line: what ran, where and when."""
    p = run(gpu_id)["provenance"]
    return (f"{p['gpu']} (driver {p['driver']}), torch {p['torch']}, CUDA {p['cuda']}, "
            f"cuDNN {p['cudnn']}, diffusers {p['diffusers']}, {p['date'][:10]}: "
            f"`{p['command']}`")


def _assumed(kernel: str | None, arch: str) -> float | None:
    if kernel is None:
        return None
    hit = facts()["calculator_defaults"]["attention_kernels"]["efficiency"][kernel][arch]
    return float(hit["value"]) if hit else None


def kernel_rows(gpu_id: str = "h200-sxm") -> list[dict]:
    """Per backend and length: measured TFLOP/s and share of the bf16 peak, beside the share the
    papers give for that class of kernel on this architecture (what the planner assumed)."""
    r, arch = run(gpu_id), get_gpu(gpu_id).arch
    rows = []
    for x in r["kernels"]["rates"]:
        if "tflops" not in x:
            continue
        what, kernel = BACKENDS.get(x["backend"], (x["backend"], None))
        rows.append({"backend": x["backend"], "kernel": what, "tokens": x["tokens"],
                     "shape": x["shape"], "tflops": x["tflops"], "share": x["share_of_peak"],
                     "papers_kernel": kernel, "papers_share": _assumed(kernel, arch)})
    return rows


def split_rows(gpu_id: str = "h200-sxm") -> list[dict]:
    """P key blocks plus P - 1 merges against one fused call over the same keys."""
    return run(gpu_id)["kernels"]["split"]


def forward_rows(gpu_id: str = "h200-sxm") -> list[dict]:
    """Per model: the measured forward (SDPA's own kernel choice, and held to FlashAttention-2
    where it runs), its profile by kind of kernel, and the planner's forward for one GPU of this
    kind by part, priced with the kernel SDPA chose ("sdpa") and with "fa2"; peak memory
    against the planner's weights plus activations."""
    rows = []
    for m in run(gpu_id)["models"]:
        if "seconds_per_forward" not in m:
            continue
        tok = model_tokens(m["model"])
        pred = {}
        for kernel in ("sdpa", "fa2"):
            c = cost(m["model"], tok, gpu_id, Layout(), 1, kernel=kernel)
            per = c["breakdown"]["per_forward_seconds"]
            pred[kernel] = {"linear": per["linear"], "attention": per["attention"],
                            "elementwise": per["elementwise"],
                            "total": per["linear"] + per["attention"] + per["elementwise"]}
        mem = c["breakdown"]["memory_bytes"]
        rows.append({"model": m["model"], "tokens": tok.sequence_length,
                     "sdpa_backend": m["sdpa_backend"], "measured": m["seconds_per_forward"],
                     "measured_fa2": m["flash_attention_2"].get("seconds_per_forward"),
                     "profile": m["profile"]["seconds"], "predicted": pred,
                     "peak_bytes": m["peak_bytes"],
                     "predicted_bytes": mem["weights"] + mem["activations"]})
    return rows
