"""The blockwise accumulator drawn block by block, for one query row (notebook 02's slider).

    python -m cpcourse.viz.accumulator artifacts   # writes the figure after every key block

`accumulator_steps` runs `cpcourse.online_softmax.attention_v4_blockwise` on one query row with
its trace on, and sets every block's state beside `cpcourse.attention.reference_attention`:
the running max m, the running sum l, the factor exp(m_old - m_new) that block applied to the
old l and accumulator, and the output so far, acc / l, which is exact attention over the keys
seen so far and, after the last block, over all of them. `accumulator_figure(steps, block)`
draws the state after `block`; a notebook's slider calls it.
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from cpcourse.attention import reference_attention
from cpcourse.online_softmax import attention_v4_blockwise
from cpcourse.support.errors import require


def accumulator_steps(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                      scale: float | None = None) -> dict:
    """One query row q `[D]` against k `[Lk, D]`, v `[Lk, Dv]`, in blocks of `block_size` keys.

    Returns `scores` (the row's scaled scores), `exact` (attention over all keys, `[Dv]`),
    `block_size` and `steps`: one dict per block with `block`, `keys_seen`, `m`, `l`,
    `correction` (exp(m_old - m_new); 0 for the first block, which has nothing to rescale),
    `out` (acc / l, `[Dv]`), `error` (max |out - exact|) and `prefix_error` (max |out - attention
    over the keys seen so far|, rounding only).
    """
    require(q.dim() == 1 and k.dim() == 2 and v.dim() == 2 and k.shape[1] == q.shape[0]
            and v.shape[0] == k.shape[0] >= 1,
            f"need q [D], k [Lk, D], v [Lk, Dv], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}")
    scale = q.shape[0] ** -0.5 if scale is None else float(scale)
    q4, k4, v4 = q.reshape(1, 1, 1, -1), k[None, None], v[None, None]
    trace: list = []
    attention_v4_blockwise(q4, k4, v4, block_size, scale=scale, trace=trace)
    exact = reference_attention(q4, k4, v4, scale)[0].flatten()
    steps = []
    for i, (m, l, correction, acc) in enumerate(trace):  # noqa: E741  (the paper's name)
        seen = min(k.shape[0], (i + 1) * block_size)
        out = (acc / l.unsqueeze(-1)).flatten()
        prefix = reference_attention(q4, k4[:, :, :seen], v4[:, :, :seen], scale)[0].flatten()
        steps.append({"block": i, "keys_seen": seen, "m": m.item(), "l": l.item(),
                      "correction": correction.item(), "out": out.tolist(),
                      "error": (out - exact).abs().max().item(),
                      "prefix_error": (out - prefix).abs().max().item()})
    return {"scores": ((k @ q) * scale).tolist(), "exact": exact.tolist(),
            "block_size": block_size, "steps": steps}


def accumulator_figure(run: dict, block: int) -> Figure:
    """The state after key block `block` (0-based) of `accumulator_steps(...)` `run`: the scores
    seen so far and the running max; the rescale factor and the running sum of every block up
    to this one; the output so far against the exact output."""
    steps, bs, scores = run["steps"], run["block_size"], run["scores"]
    require(0 <= block < len(steps), f"block must be in 0..{len(steps) - 1}, got {block}")
    now = steps[block]
    fig = Figure(figsize=(11, 6.2), layout="constrained")
    grid = fig.add_gridspec(2, 4)
    top = fig.add_subplot(grid[0, :])
    fac, run_l, err, out = (fig.add_subplot(grid[1, c]) for c in range(4))

    colors = ["C0" if j < block * bs else "C3" if j < now["keys_seen"] else "0.85"
              for j in range(len(scores))]
    top.bar(range(len(scores)), scores, color=colors, width=0.9)
    ends = [s["keys_seen"] for s in steps[:block + 1]]
    starts = [0, *ends[:-1]]
    top.hlines([s["m"] for s in steps[:block + 1]], [a - 0.5 for a in starts],
               [e - 0.5 for e in ends], color="k", lw=2, label="running max m after each block")
    for e in (s["keys_seen"] for s in steps[:-1]):
        top.axvline(e - 0.5, color="k", lw=0.4, alpha=0.4)
    top.set_xlim(-0.5, len(scores) - 0.5)
    top.set_xlabel(f"key (blocks of {bs}; red: this block, blue: seen, grey: still to come)")
    top.set_ylabel("score of the query row")
    top.legend(fontsize=8, loc="lower right")

    xs = list(range(block + 1))
    shown = steps[:block + 1]
    fac.bar(xs, [s["correction"] for s in shown],
            color=["C3" if s["correction"] < 1 else "0.6" for s in shown])
    for s in shown:
        fac.text(s["block"], s["correction"] + 0.02, f"{s['correction']:.2g}", ha="center",
                 fontsize=7)
    fac.set_ylim(0, 1.15)
    fac.set_title("exp(m_old − m_new): what the old\nl and acc are multiplied by", fontsize=9)
    run_l.plot(xs, [s["l"] for s in shown], "o-", color="C0")
    run_l.set_title("running sum l = Σ exp(score − m)", fontsize=9)
    err.semilogy(xs, [max(s["error"], 1e-17) for s in shown], "o-", color="C3")
    err.set_ylim(1e-17, 10)
    err.set_title("max |acc / l − exact output|\n(exact: all keys)", fontsize=9)
    for ax in (fac, run_l, err):
        ax.set_xlim(-0.6, len(steps) - 0.4)
        ax.set_xticks(range(len(steps)))
        ax.set_xlabel("key block")

    dims = range(len(run["exact"]))
    out.bar(dims, now["out"], color="C0", alpha=0.7, label="acc / l so far")
    out.plot(dims, run["exact"], "k_", ms=14, mew=2, label="exact, all keys")
    out.set_xlabel("output component")
    out.legend(fontsize=7, loc="best")
    out.set_title(f"output so far vs exact\nmax difference {now['error']:.2g}", fontsize=9)
    grew = "the max grew" if now["correction"] < 1 and block > 0 else (
        "first block" if block == 0 else "the max did not move")
    fig.suptitle(f"After block {block} ({now['keys_seen']} of {len(scores)} keys): m = "
                 f"{now['m']:.3g}, l = {now['l']:.3g}, rescale factor "
                 f"{now['correction']:.3g} ({grew})", fontsize=10)
    return fig


def _demo() -> dict:
    g = torch.Generator().manual_seed(19)
    q = torch.randn(16, generator=g, dtype=torch.float64) * 2
    k = torch.randn(48, 16, generator=g, dtype=torch.float64)
    return accumulator_steps(q, k, torch.randn(48, 8, generator=g, dtype=torch.float64), 8)


if __name__ == "__main__":
    from cpcourse.viz import write_figures

    demo = _demo()
    write_figures({f"accumulator_{b}": accumulator_figure(demo, b)
                   for b in range(len(demo["steps"]))}, dpi=80)
    print(f"final error "
          f"{demo['steps'][-1]['error']:.2g}, max grew at blocks "
          f"{[s['block'] for s in demo['steps'] if 0 < s['correction'] < 1]}")
