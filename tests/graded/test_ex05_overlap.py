"""Graded tests of notebook 05: the overlap condition against the library's cost model (05.1),
and the fewest GPUs for a layer's time against the simulated ring (05.2).

    python -m pytest tests/graded --ex 05.1 --impl solutions
"""

import functools
import math

import pytest
import torch

from cpcourse.planner.costs import comm
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.sim import simulate_ring, timeline
from cpcourse.viz.ring import at_scale

# (gpu, link, dtype, tokens, cp, heads, head_dim): NVLink hides, one NIC often does not, fp32 too
CASES = [("h100", "nvlink4", "bf16", 432000, 8, 32, 128), ("h100", "ib-ndr", "bf16", 111600, 8,
         40, 128), ("a100", "pcie4", "fp32", 9973, 3, 12, 64), ("b200", "ib-ndr", "fp16", 56320,
         16, 40, 128), ("h200", "nvlink4", "bf16", 3001, 2, 24, 128)]
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@pytest.mark.ex("05.1")
def test_matches_the_cost_model(impl):
    mod = impl("ex05_overlap")
    for gpu, link, dtype, tokens, cp, heads, head_dim in CASES:
        want = comm(tokens, cp, heads, head_dim, dtype=dtype, link=link, gpu=gpu)
        flops, bw = get_gpu(gpu).attention_flops(), get_link(link).effective_gbps * 1e9
        case = f"{gpu} over {link}, {dtype}, {want['tokens_per_rank']} tokens per rank"
        got = mod.overlap_condition(want["tokens_per_rank"], heads, head_dim, BYTES[dtype],
                                    flops, bw)
        for key, ref in (("compute_s", want["compute_seconds_per_step"]),
                         ("comm_s", want["comm_seconds_per_hop"])):
            assert math.isclose(got[key], ref, rel_tol=1e-9), \
                f"{case}: {key} = {got[key]!r}, want {ref!r} (4 Lq^2 D H / F, 2 Lq D H b / B)"
        assert got["hidden"] == want["hidden"], \
            f"{case}: hidden = {got['hidden']}, the cost model says {want['hidden']}"
        assert got["min_tokens_per_rank"] == want["min_tokens_per_rank_to_hide"], (
            f"{case}: min_tokens_per_rank = {got['min_tokens_per_rank']}, want "
            f"{want['min_tokens_per_rank_to_hide']} (F b / (2 B), rounded up; no H or D in it)")
        # the threshold really is the threshold: it hides there and not one token below
        at = mod.overlap_condition(want["min_tokens_per_rank_to_hide"], heads, head_dim,
                                   BYTES[dtype], flops, bw)
        below = mod.overlap_condition(want["min_tokens_per_rank_to_hide"] - 1, heads, head_dim,
                                      BYTES[dtype], flops, bw)
        assert at["hidden"] and not below["hidden"], \
            f"{case}: hidden must switch on exactly at min_tokens_per_rank"


# --- 05.2 how many GPUs ---------------------------------------------------------------------------

@functools.cache
def _schedule(world):
    x = torch.zeros(1, 1, world, 2)
    return simulate_ring(x, x, x, world).events


def _simulated(tokens, world, heads, head_dim, elem, flops, bw):
    """One layer's overlapped ring as the simulated timeline measures it."""
    events = at_scale(_schedule(world), tokens, heads, head_dim, elem)
    return max(r["end"] for r in timeline(events, world, flops, bw, overlap=True))


def _model(tokens, world, heads, head_dim, elem, flops, bw):
    """The same time in closed form (even split), checked against the simulation below."""
    lq = tokens // world
    step, hop = 4 * lq * lq * head_dim * heads / flops, 2 * lq * head_dim * heads * elem / bw
    return (world - 1) * max(step, hop) + step


@pytest.mark.ex("05.2")
def test_fewest_gpus_against_the_simulated_ring(impl):
    mod = impl("ex05_overlap")
    h100 = get_gpu("h100").attention_flops()
    nv, ib = (get_link(x).effective_gbps * 1e9 for x in ("nvlink4", "ib-ndr"))
    wan = (75600, 40, 128, 2)  # Wan2.1-14B at 720p: tokens, heads, head dim, bf16
    cases = [(*wan, h100, nv, 0.03, 32), (*wan, h100, nv, 0.01, 32), (*wan, h100, nv, 0.005, 32),
             (*wan, h100, ib, 0.05, 32), (*wan, h100, ib, 0.03, 32),  # under IB's floor: None
             (1200, 1, 64, 2, 1e11, 1e8, 2.5e-3, 24), (1200, 1, 64, 2, 1e11, 1e8, 2e-3, 24),
             (1200, 1, 64, 2, 1e11, 1e8, 1.0, 24),                      # one GPU is enough
             (1201, 3, 64, 4, 1e11, 1e8, 1e-3, 24)]                     # a prime: P = 1 only
    for tokens, heads, head_dim, elem, flops, bw, target, max_gpus in cases:
        got = mod.fewest_gpus(tokens, heads, head_dim, elem, flops, bw, target, max_gpus)
        size = (heads, head_dim, elem, flops, bw)
        degrees = [p for p in range(1, max_gpus + 1) if tokens % p == 0]
        want = next((p for p in degrees if _model(tokens, p, *size) <= target), None)
        case = (f"{tokens} tokens, {heads} heads of {head_dim}, {elem} B, F={flops:.3g}, "
                f"B={bw:.3g}, target {target * 1e3:g} ms, up to {max_gpus} GPUs")
        # the closed form is what the simulated ring measures, at the answer and next to it
        for p in {degrees[-1], *([want, degrees[degrees.index(want) - 1]] if want else [])}:
            assert math.isclose(_model(tokens, p, *size), _simulated(tokens, p, *size),
                                rel_tol=1e-9)
        if want is None:
            best = min(degrees, key=lambda p: _model(tokens, p, *size))
            assert got is None, (
                f"{case}: fewest_gpus = {got!r}, but no degree reaches the target: the fastest, "
                f"P = {best} of those that divide the tokens, takes "
                f"{_model(tokens, best, *size) * 1e3:.4g} ms"
                + (". Past the hiding threshold, more GPUs do not make the ring faster."
                   if best != degrees[-1] else "."))
        else:
            assert got == want, (
                f"{case}: fewest_gpus = {got!r}, want {want} (its ring takes "
                f"{_simulated(tokens, want, *size) * 1e3:.4g} ms); only degrees that divide the "
                "tokens count")


# --- 05.1 with a latency per hop: the threshold is the learner's own derivation ----------------

def _hides(lq, heads, head_dim, elem, flops, bw, latency):
    return 4 * lq * lq * head_dim * heads / flops >= latency + 2 * lq * head_dim * heads * elem / bw


@pytest.mark.ex("05.1")
def test_latency_per_hop_moves_the_threshold(impl):
    mod = impl("ex05_overlap")
    # (heads, head_dim, bytes, F, B, alpha): NCCL's floor, a framework's all-reduce, a 1 ms toy
    cases = [(40, 128, 2, 3.46e14, 4.65e10, 3.5e-6), (12, 64, 2, 3.46e14, 4.65e10, 1.968e-4),
             (2, 64, 2, 1e12, 1e9, 1e-3), (40, 128, 2, 3.46e14, 3.6e11, 1.968e-4),
             (3, 96, 4, 2e11, 2e9, 0.0)]
    for heads, head_dim, elem, flops, bw, alpha in cases:
        size = (heads, head_dim, elem, flops, bw, alpha)
        case = f"{heads} heads of {head_dim}, {elem} B, F={flops:.3g}, B={bw:.3g}, alpha={alpha:g}"
        got = mod.overlap_condition(1000, heads, head_dim, elem, flops, bw, latency_s=alpha)
        hop = alpha + 2 * 1000 * head_dim * heads * elem / bw
        assert math.isclose(got["comm_s"], hop, rel_tol=1e-9), \
            f"{case}: comm_s = {got['comm_s']!r}, want {hop!r}: a hop pays its latency too"
        n = got["min_tokens_per_rank"]
        assert isinstance(n, int) and n >= 1, f"{case}: min_tokens_per_rank = {n!r}"
        assert _hides(n, *size) and (n == 1 or not _hides(n - 1, *size)), (
            f"{case}: min_tokens_per_rank = {n}, but the step "
            + ("does not hide its hop there" if not _hides(n, *size) else
               f"already hides at {n - 1}") + ": solve compute >= latency + bytes / B for Lq")
    # with a latency, heads no longer cancel: more heads per hop amortise the fixed alpha
    few, many = (mod.overlap_condition(1000, h, 128, 2, 3.46e14, 4.65e10, latency_s=1.968e-4)
                 ["min_tokens_per_rank"] for h in (4, 40))
    assert many < few, (f"with a latency, 40 heads need {many} tokens per rank and 4 heads "
                        f"{few}: more heads make the hop longer next to its fixed latency")
