"""What small shards pay beyond their bytes: each collective's latency, and attention cut into
blocks.

    python -c "from cpcourse.planner.overheads import split_ratio; print(split_ratio(8))"

A cost model of bytes over bandwidth and FLOPs over a rate says a GPU holding a few thousand
tokens costs a few thousand tokens' worth. It pays more: every collective has a fixed latency
(alpha, NCCL's floor per message in sequence: `collective_latency`), and attention cut into P
key blocks runs P shorter kernels and P - 1 merges (`split_ratio`, measured on one H200). Both
grow with the GPU count while the work per GPU shrinks: part of why 8 GPUs do not give 8x.
`link_rate` is a link's bandwidth at the current edge of the interval
(`cpcourse.planner.uncertainty`). `cpcourse.planner.deployment` prices every term with them.
"""

from __future__ import annotations

import math

from cpcourse.planner import uncertainty
from cpcourse.planner.collectives import collective_seconds
from cpcourse.planner.facts import facts, gpu_measured
from cpcourse.planner.hardware import get_link


def split_ratio(blocks: int) -> tuple[float, str]:
    """(time of attention cut into `blocks` key blocks and merged / time fused, source), as
    `cpcourse bench gpu` measured it on one H200 (cuDNN, 75,600 tokens: 1.05x, 1.12x, 1.25x at
    2, 4, 8 blocks); between and beyond the measured counts, linear in log2(blocks) (each
    doubling adds what the last measured doubling added); 1 for one block. Small blocks pay
    it: less work per kernel launch, the same fixed cost per block, one more merge."""
    if blocks <= 1:
        return 1.0, "one block: nothing split"
    rows = sorted((r["blocks"], r["ratio"]) for run in gpu_measured().values()
                  for r in run.get("kernels", {}).get("split", []))
    if not rows:
        return 1.0, "no split measured"
    pts = [(0.0, 1.0)] + [(math.log2(b), r) for b, r in rows]
    x = math.log2(blocks)
    (x0, y0), (x1, y1) = next(((a, b) for a, b in zip(pts, pts[1:], strict=False)
                               if x <= b[0]), (pts[-2], pts[-1]))
    ratio = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ratio, ("measured on one H200 (gpu_measured_h200.json kernels.split: cuDNN at "
                   "75,600 tokens, " + ", ".join(f"{r:.2f}x at {b}" for b, r in rows) + ")")


def collective_alpha() -> tuple[float, float, str]:
    """(NCCL's floor per message, one collective through torch.distributed, source), seconds:
    the facts sheet's calculator_defaults.collective_latency. The floor is NCCL's own
    small-message time inside a node without CUDA graphs (3.5 us on H800 NVLink); the second is
    what one small all-reduce took called from Python on 8 H100s (197 us: launch, stream
    synchronisation and the op's host path). No PCIe or InfiniBand figure is recorded: the
    same floor stands for them, an under-estimate."""
    ex = facts()["calculator_defaults"]["collective_latency"]["examples"]
    lo, hi = ex["nccl_nvlink_floor"], ex["torch_distributed_8xh100"]
    return float(lo["seconds"]), float(hi["seconds"]), f"{lo['source']}; {hi['source']}"


def link_rate(link) -> float:
    """Bytes/s a link carries at the current edge (`cpcourse.planner.uncertainty`): its
    effective rate, scaled; a PCIe box priced without P2P may have it on (its fast end)."""
    if link.id == "pcie4-host" and uncertainty.current() == "fast":
        return get_link("pcie4").effective_gbps * 1e9
    return uncertainty.rate("link", link.effective_gbps * 1e9)


def collective_latency(kind: str, world: int) -> float:
    """Seconds of latency one `kind` collective over `world` ranks pays: NCCL's floor per
    message in sequence (`cpcourse.planner.collectives.latency_rounds`); fast edge, the floor
    once (NCCL groups the sends); slow edge, a collective through torch.distributed if more."""
    floor, torch_call, _ = collective_alpha()
    per = collective_seconds(kind, 0.0, world, alpha=floor, gbps=1.0)["latency_s"]
    if world <= 1 or not uncertainty.latency_on():
        return 0.0
    return uncertainty.pick(per, floor, max(per, torch_call))
