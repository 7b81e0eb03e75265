"""Notebook 02's block-by-block accumulator (cpcourse.viz.accumulator) and the trace behind it.

    python -m pytest tests/unit/test_viz_accumulator.py -q
"""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from matplotlib.colors import to_hex  # noqa: E402

from cpcourse.attention import reference_attention  # noqa: E402
from cpcourse.online_softmax import attention_v4_blockwise  # noqa: E402
from cpcourse.support.errors import InputError  # noqa: E402
from cpcourse.viz.accumulator import accumulator_figure, accumulator_steps  # noqa: E402


def _row(n_keys=29, d=6, dv=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(d, generator=g, dtype=torch.float64) * 3
    return (q, torch.randn(n_keys, d, generator=g, dtype=torch.float64),
            torch.randn(n_keys, dv, generator=g, dtype=torch.float64))


def test_v4_trace_holds_the_correction_and_the_accumulator():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64) * 3 for n in (3, 12, 12))
    trace = []
    out, lse = attention_v4_blockwise(q, k, v, 5, trace=trace)
    assert len(trace) == 3 and all(len(t) == 4 for t in trace)
    m, l, c, acc = trace[-1]  # noqa: E741
    assert torch.allclose(acc / l.unsqueeze(-1), out) and torch.allclose(m + l.log(), lse)
    assert (trace[0][2] == 0).all()  # the first block has nothing to rescale
    m_prev = trace[1][0]
    assert torch.allclose(c, torch.exp(m_prev - m))


def test_steps_follow_the_online_softmax_and_end_exact():
    q, k, v = _row()
    bs, scale = 7, 6 ** -0.5
    run = accumulator_steps(q, k, v, bs)
    steps, scores = run["steps"], torch.tensor(run["scores"], dtype=torch.float64)
    assert [s["keys_seen"] for s in steps] == [7, 14, 21, 28, 29]
    assert torch.allclose(scores, (k @ q) * scale)
    m_old = -math.inf
    for s in steps:
        seen = scores[:s["keys_seen"]]
        assert s["m"] == pytest.approx(seen.max().item())
        assert s["l"] == pytest.approx(torch.exp(seen - seen.max()).sum().item())
        assert s["correction"] == pytest.approx(math.exp(m_old - s["m"]))
        assert s["prefix_error"] < 1e-12  # acc / l is exact attention over the keys seen
        m_old = s["m"]
    exact = reference_attention(q.reshape(1, 1, 1, -1), k[None, None], v[None, None])[0]
    assert torch.allclose(torch.tensor(run["exact"], dtype=torch.float64), exact.flatten())
    assert steps[-1]["error"] < 1e-12 and steps[0]["error"] > 1e-3


def test_figure_shows_the_state_of_the_block_asked_for():
    run = accumulator_steps(*_row(), 7)
    for block in (0, 2, 4):
        fig = accumulator_figure(run, block)
        top, fac, run_l, err, out = fig.axes
        now = run["steps"][block]
        assert [p.get_height() for p in fac.patches] == [
            s["correction"] for s in run["steps"][:block + 1]]
        assert list(run_l.get_lines()[0].get_ydata()) == [
            s["l"] for s in run["steps"][:block + 1]]
        assert [p.get_height() for p in out.patches] == now["out"]
        assert list(out.get_lines()[0].get_ydata()) == run["exact"]
        segments = top.collections[0].get_segments()  # the running max, one segment per block
        assert [seg[0][1] for seg in segments] == [s["m"] for s in run["steps"][:block + 1]]
        colors = [to_hex(p.get_facecolor()) for p in top.patches]
        assert colors.count(to_hex("C3")) == now["keys_seen"] - 7 * block  # this block's keys
        assert colors.count(to_hex("C0")) == 7 * block  # the blocks before it
        assert f"{now['keys_seen']} of 29 keys" in fig._suptitle.get_text()
    with pytest.raises(InputError, match="block must be"):
        accumulator_figure(run, 5)
