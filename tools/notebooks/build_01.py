"""python tools/notebooks/build_01.py: write notebooks/01_attention_on_one_device.ipynb.

Authored as a list of cells so that it stays reviewable as text; every number the notebook
states is printed by a code cell from `cpcourse`. `--check` exits 1 when the committed notebook
differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("01_attention_on_one_device.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 01 · Attention on one device

Notebook 00 counted tokens: a few seconds of 720p video become a sequence of over a hundred
thousand of them. This notebook follows that sequence into one attention layer on one device and
measures what it costs:

1. how a video becomes the `[B, H, L, D]` tensors attention works on;
2. **naive attention** (exercise 01.1), and its memory, measured: one `L × L` score matrix per
   head, the *memory wall*;
3. **fused attention** (the FlashAttention idea, here PyTorch's fused CPU kernel): same answer,
   memory linear in `L`;
4. what a fused kernel removes and what it still has to keep (Q, K, V, activations), for the
   model of notebook 00;
5. the **log-sum-exp** (exercise 01.2), the one extra number per query that lets attention be
   computed in pieces, which is what notebook 02 and the ring need.

Every number below is printed by a code cell. Runs on a laptop CPU in seconds."""),
    ("code", """\
%matplotlib inline
import time

import torch
from IPython.display import display

import cpcourse
from cpcourse import attention as A
from cpcourse.costs import attention_flops
from cpcourse.hardware import get_gpu
from cpcourse.memory import peak_memory
from cpcourse.tokens import get_model, model_tokens
from cpcourse.viz import attention as va
from cpcourse.viz import fmt
from cpcourse.viz import tokens as vt
from cpcourse.viz.fmt import say, show_table

torch.manual_seed(0)
hy = get_model("hunyuanvideo-13b")  # notebook 00's running example
hy_tok = model_tokens(hy.id)
h100 = get_gpu("h100")
say(f"Running example: **{hy.name}** at its default {hy_tok.width} x {hy_tok.height}, "
    f"{hy_tok.frames} frames: **{fmt.count(hy_tok.sequence_length)} tokens**, "
    f"{hy.heads} heads of dimension {hy.head_dim}, {hy.layers} layers.")"""),
    ("md", """\
## 1. From a video to a sequence

The VAE turns the clip into a latent grid of `T × H × W` cells and the DiT cuts it into patches;
each patch is a token. Attention does not know about frames: the tokens are **flattened in
`(t, h, w)` order** into one sequence, so token `t·H·W + h·W + w` is row `h`, column `w` of
frame `t`. A contiguous run of the sequence is therefore a run of whole frames (this is what
lets context parallelism split a video by time later on).

A tiny grid makes the order visible:"""),
    ("code", """\
T, Hp, Wp = 3, 2, 4  # a toy latent video: 3 frames of 2 x 4 tokens
order = torch.arange(T * Hp * Wp).reshape(T, Hp, Wp)
for t in range(T):
    print(f"frame {t}:", order[t].tolist())
say(f"Sequence position of frame 2, row 1, column 3: **{int(order[2, 1, 3])}** "
    f"= 2·{Hp * Wp} + 1·{Wp} + 3. {hy.name}'s grid is {hy_tok.token_frames} x "
    f"{hy_tok.latent_height // hy.patch[1]} x {hy_tok.latent_width // hy.patch[2]} tokens "
    f"(+{hy_tok.text_tokens} text tokens attended jointly).")"""),
    ("md", """\
Each layer projects the tokens to queries, keys and values and splits the width into heads:
`q, k, v` have shape `[B, H, L, D]` (batch, heads, sequence, head dimension), the layout of
`torch.nn.functional.scaled_dot_product_attention` and of everything in `cpcourse`."""),
    ("code", """\
L, D = hy_tok.sequence_length, hy.head_dim
qkv_one = 3 * L * hy.heads * D * 2  # bf16
say(f"For {hy.name}: q, k, v are `[1, {hy.heads}, {fmt.count(L)}, {D}]` each, "
    f"**{fmt.nbytes(qkv_one)}** together in bf16, per layer.")"""),
    ("md", """\
## 2. Naive attention

For each head, every query scores every key, the scores of a query go through a softmax over
the keys, and the output is the weighted average of the values:

$$\\mathrm{out} = \\mathrm{softmax}\\!\\left(\\frac{q k^\\top}{\\sqrt{D}}\\right) v,
\\qquad q k^\\top \\in \\mathbb{R}^{L_q \\times L_k} \\text{ per head.}$$

**Exercise 01.1.** Open `exercises/ex01_attention.py` and write `naive_attention`, the direct
way. The docstring printed below is the spec. Until you write it, the cells say *not implemented
yet* and use the reference answer; save your file and rerun them to use yours."""),
    ("code", """\
naive_attention = cpcourse.exercise("01.1")
print(naive_attention.__doc__)"""),
    ("code", """\
q, k, v = (torch.randn(2, 3, 37, 16) for _ in range(3))  # odd length on purpose
mine = naive_attention(q, k, v)
ref, _ = A.reference_attention(q.double(), k.double(), v.double())
err = (mine.double() - ref).abs().max().item()
say(f"max |naive_attention - float64 reference| = **{err:.2g}** "
    f"(the course's float32 tolerance is {A.TOLERANCES[torch.float32]['out'][0]:g}).")"""),
    ("code", """\
cpcourse.check("01.1")  # runs the graded tests of 01.1 on exercises/ex01_attention.py"""),
    ("md", """\
## 3. The memory wall, measured

The score matrix has `L × L` entries per head. `cpcourse.memory.peak_memory` runs a call and
records every tensor it allocates and frees (on CPU through a `TorchDispatchMode`; on CUDA
from the allocator's counters), so we can *measure* the peak instead of guessing it, and compare
it with the cost model `cpcourse.costs.memory` used in notebook 00. The library's naive version
(`reference_attention`) runs its softmax in place, so it holds exactly one matrix per head."""),
    ("code", """\
wall = va.measure_memory_wall([256, 512, 1024, 2048], heads=4, head_dim=64)
show_table([{"L": r["length"], "naive, measured": fmt.nbytes(r["naive_bytes"]),
             "model: L·L·4 B·heads": fmt.nbytes(r["predicted_matrix_bytes"]),
             "measured / model": f"{r['naive_over_predicted']:.3f}",
             "fused, measured": fmt.nbytes(r["fused_bytes"])} for r in wall])
display(va.memory_wall_figure(wall, extrapolate_to=16384, heads=4))"""),
    ("code", """\
worst = max(abs(r["naive_over_predicted"] - 1) for r in wall if r["length"] >= 1024)
big = vt.gpu_memory(hy, hy_tok.sequence_length, 1)
say(f"From L = 1024 on, measured and predicted agree within **{100 * worst:.1f}%**; the rest is "
    f"the output and the row statistics, which grow like L, so they matter only for short "
    f"sequences (at L = {wall[0]['length']}: {wall[0]['naive_over_predicted']:.2f}x the model). "
    f"Doubling L multiplies the naive peak by "
    f"**{wall[-1]['naive_bytes'] / wall[-2]['naive_bytes']:.2f}** and the fused one by "
    f"**{wall[-1]['fused_bytes'] / wall[-2]['fused_bytes']:.2f}**.\\n\\n"
    f"At {hy.name}'s {fmt.count(hy_tok.sequence_length)} tokens the same model gives "
    f"**{fmt.nbytes(big['scores'])}** of scores for one layer in bf16, "
    f"{big['scores'] / h100.hbm_bytes:.0f} times an {h100.name}'s {fmt.gb(h100.hbm_bytes)}. "
    f"This is notebook 00's 'materialised' figure: {fmt.nbytes(big['materialised'])} per GPU.")"""),
    ("md", """\
## 4. Fused attention: the same answer without the matrix

A fused kernel (FlashAttention on GPUs; PyTorch's flash kernel for CPU, which is what
`scaled_dot_product_attention` runs here) walks over `K, V` in tiles and never stores the
`L × L` matrix: it keeps, per query, a running maximum, a running sum and a running weighted
sum of values (notebook 02 builds exactly this). `cpcourse.attention.attention_with_lse` calls the
fastest such kernel available and also returns each query's log-sum-exp."""),
    ("code", """\
q, k, v = (torch.randn(1, 4, 2048, 64) for _ in range(3))
backend = A.attention_backend(q)

def best_of(fn, n=3):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)

with torch.no_grad():
    t_naive = best_of(lambda: A.reference_attention(q, k, v))
    t_fused = best_of(lambda: A.attention_with_lse(q, k, v))
    (out_f, lse_f), m_fused = peak_memory(A.attention_with_lse, q, k, v)
    (out_n, lse_n), m_naive = peak_memory(A.reference_attention, q, k, v)
flops = attention_flops(2048, 2048, 64, 4)
show_table([
    {"": "naive (materialised)", "seconds": fmt.seconds(t_naive),
     "GFLOP/s": f"{flops / t_naive / 1e9:.1f}", "peak memory": fmt.nbytes(m_naive)},
    {"": f"fused ({backend})", "seconds": fmt.seconds(t_fused),
     "GFLOP/s": f"{flops / t_fused / 1e9:.1f}", "peak memory": fmt.nbytes(m_fused)},
])
say(f"Same result: max |out difference| = **{(out_f - out_n).abs().max().item():.1g}**, "
    f"max |lse difference| = {(lse_f - lse_n).abs().max().item():.1g}. The fused kernel used "
    f"**{m_naive / m_fused:.0f}x less memory** here, and its memory grows with L, not L². "
    f"(Timings are this machine's, this minute; `cpcourse bench kernel` measures properly.)")"""),
    ("md", """\
## 5. What fused attention removes, and what it keeps

The fused kernel removes the score matrices. It cannot remove anything that is not attention's
intermediate: the **Q, K, V** it reads, the layer's **activations** (hidden state, MLP
intermediate) and the **weights**. All of these but the weights grow with `L`. For the running
example at its default size, one layer, bf16 (the sizes come from `cpcourse.costs.memory`):"""),
    ("code", """\
keeps = va.what_fused_keeps(hy_tok.sequence_length, hy.hidden, hy.heads, ffn=hy.ffn,
                            params_b=hy.params_b)
show_table(keeps, ["tensor", "size", "fused kernel keeps it"])
display(va.what_fused_keeps_figure(keeps, h100.hbm_bytes,
                                   f"{hy.name}, {fmt.count(hy_tok.sequence_length)} tokens, "
                                   "one layer, bf16"))"""),
    ("code", """\
step = (attention_flops(L, L, hy.head_dim, hy.heads) * hy.layers * hy.cfg_forwards
        / h100.attention_flops())
say(f"With a fused kernel one {h100.name} holds **{fmt.nbytes(big['fused'])}** "
    f"(weights {fmt.nbytes(big['weights'])} + one layer's activations "
    f"{fmt.nbytes(big['activations'])}): it fits, as notebook 00 found. What does not go away "
    f"is time: attention alone costs {fmt.sci(attention_flops(L, L, hy.head_dim, hy.heads))} "
    f"FLOPs per layer, **{fmt.seconds(step)} per sampling step** on one {h100.name} at "
    f"{h100.attention_efficiency:.0%} of its peak. Splitting the *sequence* across GPUs "
    f"(context parallelism) divides that time and the activations, and every ring of the "
    f"course calls `attention_with_lse` on each piece.")"""),
    ("md", """\
## 6. The log-sum-exp

Why return `lse`? The softmax of a row needs its sum over *all* keys. If a device only sees
some keys, it can still compute attention over them, provided it also returns
`lse = log Σ_j exp(s_j)`: two partial results over disjoint keys can then be merged exactly
(notebook 02). Computing it naively fails as soon as scores are large, because `exp`
overflows. Video DiTs see scores in the hundreds or thousands (few keys match a query
very strongly):"""),
    ("code", """\
row = torch.tensor([1.0, 3.0, 100.0, 2.0])
say(f"`exp(100)` in float32 = {torch.exp(torch.tensor(100.0)).item()}; the textbook "
    f"softmax of {row.tolist()} gives **{A.softmax_v1_naive(row).tolist()}**. Subtracting "
    f"the row max first gives {[f'{x:.3g}' for x in A.softmax_v2_safe(row).tolist()]}.")"""),
    ("md", """\
**Exercise 01.2.** Write `attention_and_lse` in `exercises/ex01_attention.py`: attention and
each query's log-sum-exp, correct for scores up to 1e4, without calling `torch.logsumexp` or
`softmax` (the graded test switches them off): subtract each row's maximum `m`, and add it back,
`lse = m + log Σ exp(s − m)`."""),
    ("code", """\
attention_and_lse = cpcourse.exercise("01.2")
q, k, v = (torch.randn(1, 2, 9, 32) for _ in range(3))
q = q * 1800  # scores in the thousands
out, lse = attention_and_lse(q, k, v)
ref_out, ref_lse = A.reference_attention(q.double(), k.double(), v.double())
say(f"Scores reach {(q @ k.transpose(-2, -1) / 32 ** 0.5).abs().max().item():.3g}; "
    f"finite lse: **{bool(torch.isfinite(lse).all())}**, max |lse - reference| = "
    f"{(lse.double() - ref_lse).abs().max().item():.2g}.")"""),
    ("code", """\
cpcourse.check("01.2")"""),
    ("md", """\
## 7. Worked questions

**Q1.** At what sequence length does the naive score matrix of *one layer* of the running
example (all heads, bf16) stop fitting in one H100, with nothing else on it?

**Q2.** How many times more memory does naive attention need than fused attention at the
running example's length (whole GPU, one layer, as in notebook 00)?

**Q3.** The measured fused peak is the output plus the lse. How many bytes per token and head is
that in fp32 with D = 64?"""),
    ("code", """\
l_max = int((h100.hbm_bytes / (hy.heads * 2)) ** 0.5)
say(f"**A1.** L² · {hy.heads} heads · 2 B ≤ {fmt.gb(h100.hbm_bytes)} gives L ≤ "
    f"**{fmt.count(l_max)} tokens**, {l_max / hy_tok.sequence_length:.1%} of the running "
    f"example's sequence.\\n\\n"
    f"**A2.** {fmt.nbytes(big['materialised'])} / {fmt.nbytes(big['fused'])} = "
    f"**{big['materialised'] / big['fused']:.0f}x**.\\n\\n"
    f"**A3.** {wall[-1]['fused_bytes'] / (wall[-1]['length'] * 4):.0f} bytes per token and "
    f"head: 64 output values and one lse, 4 bytes each = {64 * 4 + 4}.")"""),
    ("md", """\
Next, notebook 02: how the fused kernel gets the softmax right while seeing the keys one block
at a time (the online softmax), and how two partial results merge through their log-sum-exp."""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
