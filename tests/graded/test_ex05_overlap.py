"""Graded test of notebook 05: the overlap condition against the library's cost model.

    python -m pytest tests/graded --ex 05.1 --impl solutions
"""

import math

import pytest

from cpcourse.costs import comm
from cpcourse.hardware import get_gpu, get_link

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
