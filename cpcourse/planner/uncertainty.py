"""How sure a plan is: every uncertain input's range, and the interval of seconds they span.

    cpcourse plan --model wan2.1-t2v-14b --gpus 8 --gpu h800 --json   # seconds_total_interval

A prediction is one number, but each of its inputs is known only to a range. Rather than fit a
spread to the published runs (nothing here reads one), each input carries the range its own
sources give, and the plan is costed twice more: once with every input at the end that makes the
run fast (`edge("fast")`), once at the end that makes it slow (`edge("slow")`). The two totals
are `seconds_total_interval` = [lo, hi]. The inputs (`RANGES`, factors on the value the planner
uses; `source` says where each end comes from):

    kernel_share    attention's share of peak: the spread `cpcourse bench gpu` measured on one
                    H200 for one backend across five shapes (SDPA flash 34-36%, cuDNN 57-67%):
                    x0.92 to x1.10
    link            a link's effective bandwidth: nccl-tests' bus bandwidth on H100 NVLink
                    (370 of 450 GB/s: the 0.8 used) spans about 0.7-0.9 of line rate between
                    message sizes and NCCL versions: x0.85 to x1.1. A PCIe box with P2P off may
                    have it on: its fast end is PCIe P2P's (`hardware.links`, pcie4)
    alpha           a collective's latency: fast, NCCL's floor once per collective (grouped
                    sends); slow, what one collective took through torch.distributed on 8 H100s
                    (197 us) if that is more than the floor per message
                    (facts calculator_defaults.collective_latency)
    elementwise     norms, modulations, rotary: fast, the derived bytes at a copy's rate; slow,
                    twice that (the H200 profile's "other" kernels took 1.4-2.0x it)
    split           attention cut into P blocks: fast, only the merge's bytes; slow, the
                    overhead the H200 measured (1.05x, 1.12x, 1.25x at P = 2, 4, 8)
    decode          the VAE decode's roofline: fast, the largest share of peak and the smallest
                    bytes per FLOP any timed decode showed; slow, the smallest share and the
                    largest bytes per FLOP (`cpcourse.planner.fixed_costs.decode_roofline`)
The edge is a context variable, so the cost functions read it where they use an input and nothing
else changes: outside `edge(...)` every function gives the planner's one number.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

from cpcourse.support.errors import require

EDGES = ("mid", "fast", "slow")
_EDGE: ContextVar[str] = ContextVar("planner_edge", default="mid")

# name -> (factor at the fast end, factor at the slow end, source); factors scale a rate
RANGES = {
    "kernel_share": (1.10, 0.92, "cpcourse bench gpu on one H200 (gpu_measured_h200.json): one "
                     "backend across five shapes, SDPA flash 34.0-36.3%, cuDNN 57.4-66.9%"),
    "link": (1.10, 0.85, "nccl-tests #212: H100 NVLink bus bandwidth about 370 of 450 GB/s "
             "(0.82, the 0.8 used); 0.7-0.9 across message sizes and NCCL versions"),
    "elementwise": (1.0, 0.5, "the H200 profile (gpu_measured_h200.json models[].profile): "
                    "the 'other' kernels took 1.4-2.0x the derived element-wise term (Wan 1.3B "
                    "0.160 s, 14B 1.63 s, HunyuanVideo 2.49 s); slow end, 2x the bytes' time"),
}


_LATENCY: ContextVar[bool] = ContextVar("planner_latency", default=True)


@contextmanager
def no_latency():
    """Inside the block, collectives cost their bytes alone (alpha = 0): the model notebook 10's
    exercises build by hand, before section 6 adds each collective's latency."""
    token = _LATENCY.set(False)
    try:
        yield
    finally:
        _LATENCY.reset(token)


def latency_on() -> bool:
    """Whether collectives pay their latency here (False only inside `no_latency()`)."""
    return _LATENCY.get()


def current() -> str:
    """The edge the cost functions price at now: "mid" (the planner's number), "fast", "slow"."""
    return _EDGE.get()


@contextmanager
def edge(which: str):
    """Price every uncertain input at its `which` end ("fast" or "slow") inside the block."""
    require(which in EDGES, f"edge must be one of {', '.join(EDGES)}, got {which!r}")
    token = _EDGE.set(which)
    try:
        yield which
    finally:
        _EDGE.reset(token)


def rate(name: str, value: float) -> float:
    """`value`, a rate (FLOP/s, bytes/s), scaled to the current edge of input `name`."""
    fast, slow, _ = RANGES[name]
    return value * {"mid": 1.0, "fast": fast, "slow": slow}[current()]


def pick(mid, fast, slow):
    """Of three values of one input, the one the current edge prices."""
    return {"mid": mid, "fast": fast, "slow": slow}[current()]


def interval(price) -> tuple[float, float]:
    """[lo, hi] seconds: `price()` (a function returning seconds) at the fast and slow edges."""
    with edge("fast"):
        lo = price()
    with edge("slow"):
        hi = price()
    return (min(lo, hi), max(lo, hi))


def sources() -> dict:
    """Each input's range as a factor on the planner's value, with its source (for --json)."""
    out = {k: {"fast": f, "slow": s, "source": src} for k, (f, s, src) in RANGES.items()}
    out["alpha"] = {"source": "facts calculator_defaults.collective_latency: NCCL's floor "
                    "(NVIDIA/nccl #1984) to torch.distributed on 8 H100s (IBM "
                    "pytorch-communication-benchmarks #1)"}
    out["split"] = {"source": "gpu_measured_h200.json kernels.split (cuDNN, 75,600 tokens)"}
    out["decode"] = {"source": "data/vae_decode_measured.json through "
                     "cpcourse.planner.fixed_costs.decode_roofline"}
    return out
