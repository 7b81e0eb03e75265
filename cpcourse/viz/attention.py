"""Figures for notebooks 01 and 02: the memory wall, what fused attention keeps, the online softmax.

    python -m cpcourse.viz.attention artifacts   # writes the four figures as PNG files

Every number drawn is computed by `cpcourse` (measured with `cpcourse.support.peak_memory`,
predicted with `cpcourse.planner.costs`, or produced by `cpcourse.online_softmax`). Figures are
matplotlib `Figure` objects built without pyplot, as in `cpcourse.viz.tokens`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, NullFormatter

from cpcourse.planner.costs import memory
from cpcourse.viz import fmt


def measure_memory_wall(lengths: Sequence[int], heads: int = 4, head_dim: int = 64) -> list[dict]:
    """Peak memory of naive and fused attention, measured, next to the cost model's matrix bytes.

    One row per L (fp32, B = 1): `naive_bytes` (reference_attention), `fused_bytes`
    (attention_with_lse), `predicted_matrix_bytes` (costs.memory: L * L * 4 * heads) and
    `naive_over_predicted`.
    """
    from cpcourse.attention import attention_with_lse, reference_attention
    from cpcourse.support.peak_memory import peak_memory

    rows = []
    for length in lengths:
        q, k, v = (torch.randn(1, heads, length, head_dim) for _ in range(3))
        with torch.no_grad():
            _, naive = peak_memory(reference_attention, q, k, v)
            _, fused = peak_memory(attention_with_lse, q, k, v)
        predicted = memory(length, heads * head_dim, heads, dtype="fp32")["attention_matrix_bytes"]
        rows.append({"length": length, "naive_bytes": naive, "fused_bytes": fused,
                     "predicted_matrix_bytes": predicted,
                     "naive_over_predicted": naive / predicted})
    return rows


def memory_wall_figure(rows: list[dict], extrapolate_to: int | None = None,
                       heads: int = 4) -> Figure:
    """Measured peak bytes against L (log-log): naive grows as L^2, fused as L.

    With `extrapolate_to`, the cost model's lines continue to that many tokens (same heads, fp32).
    """
    fig = Figure(figsize=(7.5, 4.2), layout="constrained")
    ax = fig.add_subplot()
    ls = [r["length"] for r in rows]
    ax.plot(ls, [r["naive_bytes"] for r in rows], "o", color="C3", label="naive, measured")
    ax.plot(ls, [r["fused_bytes"] for r in rows], "s", color="C0", label="fused, measured")
    top = max(extrapolate_to or 0, max(ls))
    grid = [ls[0] * 2 ** (i / 4) for i in range(200) if ls[0] * 2 ** (i / 4) <= top * 1.001]
    per_len = rows[-1]["fused_bytes"] / rows[-1]["length"]
    ax.plot(grid, [memory(int(n), heads, heads, dtype="fp32")["attention_matrix_bytes"]
                   for n in grid], "-", color="C3", alpha=0.6, label="L x L x 4 B x heads (model)")
    ax.plot(grid, [per_len * n for n in grid], "-", color="C0", alpha=0.6,
            label="fused: output + lse, linear in L")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L (tokens)")
    ax.set_ylabel("peak bytes during the call")
    ax.yaxis.set_major_formatter(lambda y, _: fmt.nbytes(y))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"Attention memory, {heads} heads, fp32: measured points, model lines")
    return fig


def what_fused_keeps(tokens: int, hidden: int, heads: int, *, dtype: str = "bf16",
                     ffn: int | None = None, params_b: float | None = None) -> list[dict]:
    """Bytes of one layer's tensors at `tokens` tokens (costs.memory), largest first, each marked
    with whether a fused (FlashAttention-style) kernel still has to hold it."""
    m = memory(tokens, hidden, heads, dtype=dtype, ffn=ffn, params_b=params_b)
    rows = [
        ("attention scores, all heads (L x L each)", m["attention_matrix_bytes"], False),
        ("Q, K, V", m["qkv_bytes"], True),
        ("hidden state x (L x hidden)", m["hidden_state_bytes"], True),
        ("MLP intermediate (L x ffn)", m["mlp_intermediate_bytes"], True),
        ("one layer's activations in all", m["activation_bytes_per_layer"], True),
    ]
    if params_b is not None:
        rows.append(("model weights", m["weights_bytes"], True))
    return [{"tensor": name, "bytes": b, "size": fmt.nbytes(b),
             "fused kernel keeps it": "yes" if keep else "no: recomputed tile by tile"}
            for name, b, keep in sorted(rows, key=lambda r: -r[1])]


def what_fused_keeps_figure(rows: list[dict], hbm_bytes: float | None = None,
                            title: str = "") -> Figure:
    """Horizontal bars (log scale) of `what_fused_keeps` rows; the GPU's memory as a line."""
    fig = Figure(figsize=(7.5, 3.2), layout="constrained")
    ax = fig.add_subplot()
    names = [r["tensor"] for r in rows][::-1]
    sizes = [r["bytes"] for r in rows][::-1]
    colors = ["C0" if r["fused kernel keeps it"] == "yes" else "C3" for r in rows][::-1]
    ax.barh(names, sizes, color=colors)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(lambda x, _: fmt.nbytes(x))
    if hbm_bytes:
        ax.axvline(hbm_bytes, color="k", ls="--", lw=1)
        ax.text(hbm_bytes, -0.45, " one GPU's memory", fontsize=8, va="bottom")
    ax.set_title(title or "red: removed by fused attention; blue: still held", fontsize=10)
    ax.tick_params(axis="y", labelsize=8)
    return fig


def running_stats_figure(row: torch.Tensor, block_size: int) -> Figure:
    """One row of scores streamed in blocks: the values, the running max m, and the running
    sum s = sum exp(x - m) over the columns seen so far, after each block."""
    from cpcourse.online_softmax import online_softmax_stats

    row = row.double().flatten()
    trace: list = []
    online_softmax_stats(row.unsqueeze(0), block_size, trace=trace)
    ends = [min(len(row), (i + 1) * block_size) for i in range(len(trace))]
    m = [t[0].item() for t in trace]
    s = [t[1].item() for t in trace]
    fig = Figure(figsize=(8, 4.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.bar(range(len(row)), row.tolist(), color="0.7", width=1.0, label="scores x")
    top.step([0, *ends], [m[0], *m], where="pre", color="C3", lw=2, label="running max m")
    for e in ends[:-1]:
        top.axvline(e - 0.5, color="k", lw=0.4, alpha=0.4)
        bottom.axvline(e - 0.5, color="k", lw=0.4, alpha=0.4)
    top.legend(fontsize=8, loc="lower right")
    top.set_ylabel("value")
    bottom.plot([e - 0.5 for e in ends], s, "o-", color="C0", label="running sum s")
    grows = [i for i in range(1, len(m)) if m[i] > m[i - 1]]
    bottom.plot([ends[i] - 0.5 for i in grows], [s[i] for i in grows], "o", mfc="none",
                color="C3", ms=10, label="max grew: old sum rescaled by exp(m_old - m_new)")
    bottom.set_ylabel("s = sum exp(x - m)")
    bottom.set_xlabel(f"column (blocks of {block_size})")
    bottom.legend(fontsize=8, loc="upper left")
    fig.suptitle("The online softmax: one pass, a running max and a running sum", fontsize=10)
    return fig


def _qkv_bf16(lq: int, lk: int, heads: int, head_dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, n, head_dim, generator=g).bfloat16() for n in (lq, lk, lk))


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max abs error over the reference's RMS: 0.1 means errors of 10% of a typical output."""
    return ((got.double() - want).abs().max() / want.pow(2).mean().sqrt()).item()


def blockwise_accumulator_errors(key_lengths: Sequence[int], *, queries: int = 16,
                                 heads: int = 4, head_dim: int = 64, block: int = 128,
                                 seed: int = 0) -> list[dict]:
    """Blockwise attention (v4) on bf16 inputs with its running max/sum/acc in float32 vs in
    bfloat16: one row per key count, `float32` / `bfloat16` = relative out error (see
    `_relative`), `*_lse` = max abs lse error, all against float64."""
    from cpcourse.attention import reference_attention
    from cpcourse.online_softmax import attention_v4_blockwise

    rows = []
    for n in key_lengths:
        q, k, v = _qkv_bf16(queries, n, heads, head_dim, seed + n)
        want_out, want_lse = reference_attention(q.double(), k.double(), v.double())
        row: dict = {"keys": n}
        for acc in (torch.float32, torch.bfloat16):
            out, lse = attention_v4_blockwise(q, k, v, block, acc_dtype=acc)
            name = str(acc).removeprefix("torch.")
            row[name] = _relative(out, want_out)
            row[name + "_lse"] = (lse.double() - want_lse).abs().max().item()
        rows.append(row)
    return rows


def ring_merge_errors(steps: Sequence[int], *, length: int = 4096, queries: int = 256,
                      heads: int = 4, head_dim: int = 64, seed: int = 0) -> list[dict]:
    """A ring's P partial results merged one after another, keeping the running (out, lse) in
    float32 vs rounding it to bf16 after every merge. One row per P: relative out error."""
    from cpcourse.attention import attention_with_lse, merge_attention, reference_attention

    q, k, v = _qkv_bf16(queries, length, heads, head_dim, seed)
    want_out, _ = reference_attention(q.double(), k.double(), v.double())
    rows = []
    for p in steps:
        parts = [attention_with_lse(q, kb, vb) for kb, vb in zip(k.chunk(p, 2), v.chunk(p, 2),
                                                                  strict=True)]
        run32, run16 = parts[0], parts[0]
        for part in parts[1:]:
            run32 = merge_attention(*run32, *part)
            out16, lse16 = merge_attention(*run16, *part)
            run16 = (out16.bfloat16(), lse16.bfloat16().float())
        rows.append({"steps": p, "float32": _relative(run32[0].bfloat16(), want_out),
                     "bfloat16": _relative(run16[0], want_out)})
    return rows


def accumulator_error_figure(rows: list[dict], x_key: str, x_label: str, title: str) -> Figure:
    """Error against a float64 reference when the running state is float32 vs bfloat16.

    rows: dicts with `x_key`, `float32` and `bfloat16` (errors, > 0).
    """
    fig = Figure(figsize=(6.5, 3.6), layout="constrained")
    ax = fig.add_subplot()
    xs = [r[x_key] for r in rows]
    for key, color in (("float32", "C0"), ("bfloat16", "C3")):
        ax.plot(xs, [max(r[key], 1e-12) for r in rows], "o-", color=color,
                label=f"running state in {key}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(x_label)
    ax.set_ylabel("max error / RMS of the output")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(lambda y, _: f"{y:g}")
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "artifacts")
    out.mkdir(parents=True, exist_ok=True)
    rows = measure_memory_wall([256, 512, 1024])
    figs = {
        "memory_wall": memory_wall_figure(rows, extrapolate_to=8192),
        "what_fused_keeps": what_fused_keeps_figure(what_fused_keeps(75_600, 3072, 24)),
        "running_stats": running_stats_figure(torch.randn(40) * 3, 8),
        "accumulators": accumulator_error_figure(
            ring_merge_errors([2, 8, 32], length=1024, queries=64), "steps",
            "ring steps P (partial results merged)", "merging in bf16 vs float32"),
    }
    for name, fig in figs.items():
        fig.savefig(out / f"{name}.png", dpi=80)
        print(out / f"{name}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
