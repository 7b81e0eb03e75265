"""cpcourse.support.peak_memory: peak tensor memory of a call, checked against allocations we know
exactly.

    python -m pytest tests/unit/test_memory.py -q
"""

from __future__ import annotations

import pytest
import torch

from cpcourse.attention import attention_v4_blockwise, attention_with_lse, reference_attention
from cpcourse.planner import costs
from cpcourse.support.peak_memory import StorageTracker, peak_memory

N = 1_000_000


def test_one_allocation_is_counted_to_the_byte():
    result, peak = peak_memory(torch.empty, N, dtype=torch.uint8)
    assert peak == N and result.numel() == N


def test_freed_memory_is_reused_in_the_count():
    def fn():
        a = torch.empty(N, dtype=torch.uint8)
        b = torch.empty(2 * N, dtype=torch.uint8)
        del a
        c = torch.empty(N, dtype=torch.uint8)  # a is gone: the peak is a + b, not a + b + c
        return b, c

    _, peak = peak_memory(fn)
    assert peak == 3 * N


def test_temporaries_inside_an_expression():
    # ones (4N) is alive while the product (4N) is made; then freed before the sum's scalar.
    _, peak = peak_memory(lambda: (torch.ones(N) * 2).sum())
    assert peak == 8 * N


def test_views_and_in_place_ops_on_inputs_add_nothing():
    x = torch.zeros(N)

    def fn(t):
        t.add_(1)
        t.view(1000, 1000).transpose(0, 1)[3:7].mul_(2)
        return t[::2]

    _, peak = peak_memory(fn, x)
    assert peak == 0 and x.sum() == N + 4 * 1000  # four columns doubled, in place


def test_resize_is_followed_and_kwargs_pass_through():
    def fn(n, *, dtype):
        t = torch.empty(0, dtype=dtype)
        t.resize_(n)
        return t

    _, peak = peak_memory(fn, N, dtype=torch.float64)
    assert peak == 8 * N


def test_tracker_reports_current_and_allocations():
    with StorageTracker() as tracker:
        keep = torch.empty(N, dtype=torch.uint8)
        del keep
    assert tracker.allocations == 1 and tracker.current_bytes == 0 and tracker.peak_bytes == N


@pytest.mark.parametrize("length", [1024, 1536])
def test_naive_attention_matches_the_cost_model_within_10_percent(length):
    heads, head_dim = 4, 64
    q = torch.randn(1, heads, length, head_dim)
    with torch.no_grad():
        _, naive = peak_memory(reference_attention, q, q, q)
        _, fused = peak_memory(attention_with_lse, q, q, q)
        _, blocked = peak_memory(attention_v4_blockwise, q, q, q, block_size=128)
    predicted = costs.memory(length, heads * head_dim, heads, dtype="fp32")
    assert predicted["attention_matrix_bytes"] == length * length * 4 * heads
    matrix = predicted["attention_matrix_bytes"]
    assert abs(naive - matrix) <= 0.10 * matrix
    out_bytes = q.numel() * 4
    # fused: the output and the lse, nothing of size L x L
    assert out_bytes <= fused <= 1.1 * out_bytes + heads * length * 4
    # blockwise: a few L x block tiles and the L x D accumulators, not the L x L matrix
    assert blocked < 0.5 * naive


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_peak_uses_the_allocator_counters():
    # `device` is peak_memory's own argument (which counter to read), not passed on to fn: the
    # allocation must name CUDA itself. (Passing torch.empty with device="cuda" allocated on
    # the CPU and read 0 bytes from CUDA's counters: seen on an H200, 2026-12-04.)
    alloc = lambda: torch.empty(4 * N, dtype=torch.uint8, device="cuda")  # noqa: E731
    _, peak = peak_memory(alloc, device="cuda")
    assert 4 * N <= peak <= 4 * N + (2 << 20)
