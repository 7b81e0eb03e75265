"""How far a parallel run may differ from one process: the one rule every comparison uses.

    python -c "from cpcourse.support.tolerance import *; print(tolerance('ring', guidance=4))"

Parallel attention is exact in arithmetic and inexact in floating point: the ring and USP merge
partial softmaxes in another order than one kernel call, tensor parallelism sums the partial
products of a linear layer in another order. The difference is rounding, so it is relative to the
outputs' size, and a sampler's guidance multiplies it (below). Every `--compare` verdict of a
model, sampler or VAE run reads its limit here (a single attention call, `cpcourse demo` and the
graded kernels keep their own, tighter, measured limits).
"""

from __future__ import annotations

import math

from cpcourse.support.errors import require

# |CP - one process| for one forward with outputs of size 1. fp32: a merge of partial softmaxes
# (ring, usp, a mesh with tp) 1e-5; Ulysses and all-gather run one kernel over the same keys, 1e-6
# (a joined-text model still differs in kernel: masked vs unmasked). bf16 and fp16 round every
# activation, so a different summation order moves outputs by a few units of their last place.
BASE = {"float32": {"merge": 1e-5, "one_kernel": 1e-6}, "float64": {"merge": 1e-12,
        "one_kernel": 1e-12}, "bfloat16": {"merge": 3e-2, "one_kernel": 3e-2},
        "float16": {"merge": 5e-3, "one_kernel": 5e-3}}
ONE_KERNEL = ("ulysses", "all_to_all", "allgather", "windows")
ALIASES = {"fp32": "float32", "fp64": "float64", "bf16": "bfloat16", "fp16": "float16"}


def guidance_gain(guidance: float | None) -> float:
    """How much classifier-free guidance multiplies a forward's error: 1 + 2|g| (1 without).

    The guided prediction is uncond + g (cond - uncond); each branch carries an error e, so the
    guided one carries up to (1 + 2|g|) e: 9x at g = 4. Sampling does not compound it further:
    an x0-predicting Euler step is a convex blend x' = (t'/t) x + (1 - t'/t) x0, so the sample's
    error stays below the largest step's prediction error (the last step returns that prediction
    itself), and a velocity model's steps add errors weighted by |dt|, which sum to 1.
    """
    if guidance is None:
        return 1.0
    g = float(guidance)
    require(math.isfinite(g), f"guidance must be a finite number, got {guidance!r}")
    return 1.0 + 2.0 * abs(g)


def tolerance(method: str, dtype: str = "float32", guidance: float | None = None,
              scale: float = 1.0) -> float:
    """Largest |parallel - one process| accepted for outputs up to `scale` in magnitude.

    `method`: how attention ran ("ring", "usp", "ulysses", "allgather", "windows", "all_to_all";
    anything else, e.g. "height_split" for a VAE decoded by rows, counts as a merge). `dtype`:
    torch's or the CLI's spelling. `guidance`: the sampler's guidance scale when the output is a
    sample (None for one forward). The limit is
    base * guidance_gain * max(1, scale), with `scale` = max |one-process output|: rounding is
    relative, so an output of 2.56 may differ by 2.56x what an output of 1 may.
    """
    name = ALIASES.get(dtype, dtype)
    require(isinstance(name, str) and name in BASE, f"dtype {dtype!r} has no tolerance: use "
            f"one of {', '.join(BASE)}")
    require(isinstance(scale, (int, float)) and not isinstance(scale, bool)
            and math.isfinite(scale) and scale >= 0, f"scale must be a finite number >= 0 (the "
            f"largest |one-process output|), got {scale!r}: a reference that is not finite "
            "cannot be compared against")
    base = BASE[name]["one_kernel" if method in ONE_KERNEL else "merge"]
    return base * guidance_gain(guidance) * max(1.0, float(scale))


def verdict(err: float, scale: float, method: str, dtype: str = "float32",
            guidance: float | None = None) -> dict:
    """A `--compare` report's keys: the difference, the limit and whether it holds. A scale
    that is not finite is an InputError (an inf scale would pass any difference)."""
    tol = tolerance(method, dtype, guidance, scale)
    return {"max_abs_diff_vs_single_process": float(err), "tolerance": tol,
            "within_tolerance": bool(err <= tol)}


def describe(report: dict) -> str:
    """One line for a report that holds `verdict`'s keys."""
    ok = "within" if report["within_tolerance"] else "OUTSIDE"
    return (f"max |difference| vs one process: {report['max_abs_diff_vs_single_process']:.3g} "
            f"({ok} the tolerance {report['tolerance']:.2g})")


def training_tolerance(steps: int, lr: float, momentum: float = 0.0, grad_scale: float = 1.0,
                       dtype: str = "float32") -> float:
    """Largest |weight under CP - weight in one process| after `steps` SGD steps.

    The rule above, extended to training: every step's gradient is held to one forward's limit,
    `tolerance("ring", dtype, scale=grad_scale)` (the merge base whatever the attention: a
    parameter's gradient is a sum over tokens that CP splits across ranks and adds in another
    order), `grad_scale` the largest |gradient| one process saw. SGD with momentum mu moves a
    weight by lr * sum_j mu^(n - j) g_j, so the weights may differ by lr * steps / (1 - mu) times
    that. It is first order: a weight difference feeds later gradients only through a second
    rounding-sized term, negligible over the few steps a comparison runs. (Adam has no such
    bound: it divides by sqrt(v) + eps, so a gradient near eps amplifies its rounding by lr/eps.)
    """
    require(steps >= 1 and lr > 0 and 0 <= momentum < 1, "need steps >= 1, lr > 0 and "
            f"0 <= momentum < 1, got {steps}, {lr}, {momentum}")
    return tolerance("ring", dtype, scale=grad_scale) * lr * steps / (1.0 - momentum)
