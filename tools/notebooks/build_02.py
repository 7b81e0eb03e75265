"""python tools/notebooks/build_02.py: write notebooks/02_online_softmax.ipynb (no outputs).

Authored as a list of cells so that it stays reviewable as text; every number the notebook
states is printed by a code cell from `cpcourse`. `--check` exits 1 when the committed notebook
differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("02_online_softmax.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 02 · The online softmax and the log-sum-exp merge

Notebook 01 ended with a promise: a fused kernel computes exact attention while it sees the keys
one tile at a time, and a device that sees only *some* keys can still contribute, provided it
returns the log-sum-exp. Both rest on one small piece of algebra. We build it in four steps, each
motivated by the failure of the one before:

1. the **two-pass** softmax (subtract the max, then sum): correct, but needs the whole row twice;
2. the **one-pass online softmax**: a running max and a running sum (exercise 02.1);
3. **blockwise attention**: the same with a running weighted sum of values (exercise 02.2),
   FlashAttention's idea without the kernel engineering;
4. the **merge** of two partial results through their log-sum-exp (exercise 02.3): what every
   step of a ring does.

Then we measure why the running state must stay in **float32** even when the inputs are bf16."""),
    ("code", """\
%matplotlib inline
import math

import ipywidgets as widgets
import torch
from IPython.display import display

import cpcourse
from cpcourse import attention as A
from cpcourse import online_softmax as osm
from cpcourse.memory import peak_memory
from cpcourse.viz import attention as va
from cpcourse.viz import fmt
from cpcourse.viz.fmt import say, show_table

_ = torch.manual_seed(0)"""),
    ("md", """\
## 1. Softmax, twice over the row

`softmax_v1_naive` is the textbook `exp(x) / Σ exp(x)`; it overflows as soon as one score passes
about 88 in float32. `softmax_v2_safe` subtracts the row's maximum `m` first: every exponent is then
at most 0, and the factor `exp(−m)` cancels between numerator and denominator. The price is **two
passes** over the row: one for the max, one for the sum."""),
    ("code", """\
row = torch.tensor([3.0, 1.0, 95.0, 2.0, 90.0])
show_table([{"version": f.__name__, "result": [f"{x:.3g}" for x in f(row).tolist()]}
            for f in (osm.softmax_v1_naive, osm.softmax_v2_safe)])"""),
    ("md", """\
Two passes are a problem when the row never exists in one place: a fused kernel streams `K` in
tiles through fast on-chip memory, and a ring delivers each device's keys one block per step. By
the time the last block arrives, the first is gone. We need the max and the sum **in one pass**.

## 2. The online softmax

Keep a running max `m` and a running sum `s = Σ exp(x − m)` over the columns seen so far. A new
block `b` may raise the max to `m' = max(m, max b)`. The old terms were written relative to `m`,
so rescale them: `exp(x − m') = exp(x − m) · exp(m − m')`, hence

$$ s' = s \\cdot e^{m - m'} + \\sum_{x \\in b} e^{x - m'} . $$

At the end `softmax(x) = exp(x − m) / s` and `logsumexp(x) = m + log s`. Move the slider to
change the block size: the circles mark the blocks where the max grew and the old sum was
rescaled."""),
    ("code", """\
scores = torch.randn(64, generator=torch.Generator().manual_seed(3)) * 3

def show_stats(block_size=8):
    display(va.running_stats_figure(scores, block_size))

widgets.interact(show_stats, block_size=widgets.IntSlider(value=8, min=1, max=64, step=1,
                                                          description="block size"));"""),
    ("code", """\
m, s = osm.online_softmax_stats(scores.unsqueeze(0), block_size=8)
lse_online = (m + torch.log(s)).item()
lse_torch = torch.logsumexp(scores.double(), 0).item()
gap = (osm.softmax_v3_online(scores, 8) - osm.softmax_v2_safe(scores)).abs().max().item()
say(f"One pass, blocks of 8: m + log s = **{lse_online:.6f}**; torch.logsumexp in float64: "
    f"{lse_torch:.6f}. softmax_v3_online and softmax_v2_safe differ by at most {gap:.1g}.")"""),
    ("md", """\
**Exercise 02.1.** Write `online_softmax_stats` in `exercises/ex02_online_softmax.py`. It receives
the blocks as an *iterable* (the graded tests pass a generator, which can be walked only once,
like keys arriving over a ring) and returns `(m, s)`."""),
    ("code", """\
online_softmax_stats = cpcourse.exercise("02.1")
x = torch.randn(4, 300) * 10
m, s = online_softmax_stats(block for block in x.split(37, dim=-1))
say(f"max |(m + log s) - logsumexp| over 4 rows = "
    f"**{(m + torch.log(s) - torch.logsumexp(x, -1)).abs().max().item():.2g}**")"""),
    ("code", """\
cpcourse.check("02.1")"""),
    ("md", """\
## 3. Blockwise attention

Attention's output for a query is `Σ_j p_j v_j / Σ_j p_j` with `p_j = exp(s_j − m)`. Add a third
running quantity, the unnormalised output `acc = Σ p_j v_j`, and rescale it with the same factor
as the sum. Per block of keys:

    s      = q @ k_blk^T * scale                 # [Lq, block]: one tile, never [Lq, Lk]
    m_new  = max(m, rowmax(s))
    c      = exp(m - m_new)                      # 0 on the first block (m = -inf)
    p      = exp(s - m_new)
    l      = l * c + rowsum(p)
    acc    = acc * c + p @ v_blk
    m      = m_new
    ...    out = acc / l,  lse = m + log(l)

This is `cpcourse.online_softmax.attention_v4_blockwise`; FlashAttention is this loop with the
tiles kept in on-chip SRAM. Its memory is one tile plus the `[Lq, D]` accumulators:"""),
    ("code", """\
q, k, v = (torch.randn(1, 4, 1024, 64) for _ in range(3))
with torch.no_grad():
    (out_b, lse_b), mem_b = peak_memory(osm.attention_v4_blockwise, q, k, v, 128)
    (out_r, lse_r), mem_r = peak_memory(A.reference_attention, q, k, v)
show_table([
    {"": "naive (whole score matrix)", "peak memory": fmt.nbytes(mem_r)},
    {"": "blockwise, blocks of 128 keys", "peak memory": fmt.nbytes(mem_b)},
])
say(f"Same answer: max |out difference| = **{(out_b - out_r).abs().max().item():.1g}**, "
    f"max |lse difference| = {(lse_b - lse_r).abs().max().item():.1g}, with "
    f"{mem_r / mem_b:.1f}x less memory (and the gap grows with L).")"""),
    ("md", """\
**Exercise 02.2.** Write `blockwise_attention` in `exercises/ex02_online_softmax.py`. A graded test
measures its peak memory with `cpcourse.memory.peak_memory`: building the full score matrix fails
it."""),
    ("code", """\
blockwise_attention = cpcourse.exercise("02.2")
q, k, v = (torch.randn(2, 3, 29, 24) for _ in range(3))
out, lse = blockwise_attention(q, k, v, 7)
ref_out, ref_lse = A.reference_attention(q.double(), k.double(), v.double())
say(f"blocks of 7 over 29 keys: max |out - reference| = "
    f"**{(out.double() - ref_out).abs().max().item():.2g}**, max |lse - reference| = "
    f"{(lse.double() - ref_lse).abs().max().item():.2g}")"""),
    ("code", """\
cpcourse.check("02.2")"""),
    ("md", """\
## 4. Merging two partial results

Now split the keys between two devices, `A` and `B`. Each computes attention over its own keys
and the log-sum-exp `lse_A`, `lse_B` of its scores. The total sum of exponentials is
`exp(lse_A) + exp(lse_B)`, and each partial output was normalised by its own part of it, so

$$ \\mathrm{lse} = \\log\\left(e^{\\mathrm{lse}_A} + e^{\\mathrm{lse}_B}\\right), \\qquad
   \\mathrm{out} = e^{\\mathrm{lse}_A - \\mathrm{lse}}\\,\\mathrm{out}_A +
                   e^{\\mathrm{lse}_B - \\mathrm{lse}}\\,\\mathrm{out}_B . $$

Both weights are at most 1 (no overflow, `torch.logaddexp` computes `lse` stably), the merge is
associative and order-free, and a side that saw no keys (`lse = −inf`) has weight 0: it is the
identity. `cpcourse.attention.merge_attention` is this formula; a ring applies it at each
step."""),
    ("code", """\
q, k, v = (torch.randn(1, 2, 50, 32) for _ in range(3))
full_out, full_lse = A.attention_with_lse(q, k, v)
halves = [A.attention_with_lse(q, k[:, :, s], v[:, :, s]) for s in (slice(0, 20), slice(20, 50))]
merged_out, merged_lse = A.merge_attention(*halves[0], *halves[1])
# Four blocks merged in a scrambled order, one of them empty:
cuts = [0, 7, 7, 31, 50]
parts = [A.attention_with_lse(q, k[:, :, a:b], v[:, :, a:b]) for a, b in zip(cuts, cuts[1:])]
acc = parts[2]
for i in (0, 3, 1):
    acc = A.merge_attention(*parts[i], *acc)
show_table([
    {"merge": "two halves (20 + 30 keys)",
     "max |out - full|": f"{(merged_out - full_out).abs().max().item():.1g}",
     "max |lse - full|": f"{(merged_lse - full_lse).abs().max().item():.1g}"},
    {"merge": "blocks 7 + 0 + 24 + 19 keys, merged in the order 3, 1, 4, 2",
     "max |out - full|": f"{(acc[0] - full_out).abs().max().item():.1g}",
     "max |lse - full|": f"{(acc[1] - full_lse).abs().max().item():.1g}"},
])
say(f"The empty block's lse is {parts[1][1].flatten()[0].item()}: the identity of the merge.")"""),
    ("md", """\
**Exercise 02.3.** Write `merge_partials`. Mind the two traps the graded tests probe: `exp(lse)`
itself overflows (lse can be 1e4), and a side with no keys must contribute nothing even if its
`out` holds NaN (`0 · NaN = NaN`), while two empty sides give `out = 0`, `lse = −inf`."""),
    ("code", """\
merge_partials = cpcourse.exercise("02.3")
out, lse = merge_partials(*halves[0], *halves[1])
say(f"merge_partials of the two halves: max |out - full| = "
    f"**{(out - full_out).abs().max().item():.1g}**")"""),
    ("code", """\
cpcourse.check("02.3")"""),
    ("md", """\
## 5. Why the running state stays in float32

Inputs are bf16 on GPUs. bf16 keeps 8 significant bits: about 2-3 decimal digits. The running sum
`l` grows with every block, and once it is large, adding one more block's small terms is lost to
rounding; every rescaling rounds again. The same happens to a ring's running output if it is
rounded to bf16 after each merge. Measured, against float64, on bf16 inputs (the error is the
largest absolute error divided by the RMS of the true output, so 0.1 means 10% of a typical
value):"""),
    ("code", """\
blockwise = va.blockwise_accumulator_errors([256, 1024, 4096, 16384], queries=8, heads=2)
show_table([{"keys": fmt.count(r["keys"]), "state in float32": f"{r['float32']:.3f}",
             "state in bf16": f"{r['bfloat16']:.3f}",
             "lse error, float32": f"{r['float32_lse']:.1e}",
             "lse error, bf16": f"{r['bfloat16_lse']:.1e}"} for r in blockwise])
display(va.accumulator_error_figure(blockwise, "keys", "keys streamed (blocks of 128)",
                                    "Blockwise attention on bf16 inputs"))"""),
    ("code", """\
ring = va.ring_merge_errors([1, 2, 8, 32, 128], length=2048, queries=64, heads=2)
show_table([{"ring steps P": r["steps"], "running out in float32": f"{r['float32']:.3f}",
             "rounded to bf16 after each merge": f"{r['bfloat16']:.3f}"} for r in ring])
display(va.accumulator_error_figure(ring, "steps", "ring steps P (partial results merged)",
                                    "Merging P partial results: float32 vs bf16 state"))"""),
    ("code", """\
b, r = blockwise[-1], ring[-1]
say(f"With float32 state the error stays at the level of bf16 rounding of the output itself "
    f"({b['float32']:.3f} of RMS at {fmt.count(b['keys'])} keys). With bf16 state it grows "
    f"with the number of blocks: **{b['bfloat16'] / b['float32']:.0f}x worse** at "
    f"{fmt.count(b['keys'])} keys, and a ring of {r['steps']} steps that rounds after every "
    f"merge ends **{r['bfloat16'] / r['float32']:.0f}x worse**. This is why "
    f"`merge_attention` and `attention_v4_blockwise` accumulate in float32 whatever the input "
    f"dtype, and why `lse` is float32 everywhere in `cpcourse` (and in FlashAttention).")"""),
    ("md", """\
## 6. Worked questions

**Q1.** A ring over P ranks delivers each rank P key blocks. How many merges does one rank run
per attention call, and how many with P = 8?

**Q2.** What is the merge of a partial result with itself (same keys counted twice)? Predict it,
then check.

**Q3.** On the random row above, how many times did the running max grow with blocks of 1, 8
and 64 columns?"""),
    ("code", """\
P = 8
out2, lse2 = A.merge_attention(full_out, full_lse, full_out, full_lse)
grows = {}
for bs in (1, 8, 64):
    tr = []
    osm.online_softmax_stats(scores.unsqueeze(0), bs, trace=tr)
    grows[bs] = sum(tr[i][0].item() > tr[i - 1][0].item() for i in range(1, len(tr)))
say(f"**A1.** P − 1 merges: the first block needs none. With P = {P}: **{P - 1}**.\\n\\n"
    f"**A2.** The same `out` (max difference {(out2 - full_out).abs().max().item():.1g}) and "
    f"`lse + log 2` (max |lse2 − lse − log 2| = "
    f"{(lse2 - full_lse - math.log(2)).abs().max().item():.1g}): the keys' weights double, "
    f"their average does not move.\\n\\n"
    f"**A3.** " + ", ".join(f"blocks of {bs}: **{n}**" for bs, n in grows.items())
    + ". Fewer, larger blocks rescale less often; the answer is the same.")"""),
    ("md", """\
Next, notebook 03: the ring, simulated. Each rank holds a block of queries, the key/value blocks
travel around the ring, and each step is exactly one `attention_with_lse` and one merge."""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
