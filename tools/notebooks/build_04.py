"""python tools/notebooks/build_04.py: write notebooks/04_ring_on_processes.ipynb (no outputs).

Authored as a list of cells so that it stays reviewable as text; every number the notebook
states is printed by a code cell from `cpcourse`. `--check` exits 1 when the committed notebook
differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("04_ring_on_processes.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 04 · The ring on real processes

Notebook 03's ring ran on virtual ranks inside one process: every rank could peek at every
mailbox, and the "network" was a Python list. Real ranks are separate processes with separate
memory; a K/V block reaches the next rank only if one process sends it and the other posts a
receive of exactly the right size, at the right time. Get that wrong and you get a hang, a
crash, or, worst, plausible numbers that are wrong. This notebook:

1. runs **your** ring (exercise 04.1) on 3 processes and checks it against float64 attention;
2. sets the ring's **measured** per-rank timeline beside the **simulation** of notebook 03;
3. runs the two alternatives side by side, **all-gather** and **Ulysses** (exercise 04.2):
   error, bytes sent, peak memory, and Ulysses' limit on the number of heads;
4. a bug hunt (exercise 04.3): a ring that passes a weak test and is wrong.

Processes are started with the `%%torchrun` cell magic: the cell's code runs on `-n` ranks
(gloo on this CPU, NCCL on GPUs) with `rank`, `world_size`, `torch` and `dist` predefined; each
rank's `RESULT` comes back in the list named by `--out`. Sizes are small so each launch takes
seconds."""),
    ("code", """\
%matplotlib inline
%load_ext cpcourse
import os

import torch

import cpcourse
from cpcourse import bench_ring, costs, sim
from cpcourse.viz import fmt
from cpcourse.viz import ring as vr
from cpcourse.viz.fmt import say, show_table"""),
    ("md", """\
## 1. Your ring on real processes

### Exercise 04.1: the ring forward

Open `exercises/ex04_ring.py` and write `ring_forward(q, k, v, group=None)`: this rank's
shards in, this rank's output out. What notebook 03's simulator did by looking into mailboxes,
a rank must now work out for itself:

* **who** to send to and receive from: your schedule of exercise 03.1;
* **how long** the incoming block is: shards differ by a token when P does not divide L, so
  the receive buffer must have the length of the block that *arrives*, not of the one you hold
  (every rank's length comes from one small all-gather, `cpcourse.dist.agree`);
* **when**: post the send and the receive together (`dist.batch_isend_irecv`), compute on the
  block you hold while they are in flight, and wait before touching the new block.

The cell below runs your function on 3 processes over 3,001 tokens (1,001 + 1,000 + 1,000),
then the library's ring (`cpcourse.ring.ring_attention`) in both of its modes, with per-step
records: **overlap** (transfer in flight during compute) and **blocking** (compute, then
transfer)."""),
    ("code", """\
%%torchrun -n 3 --out run --timeout 90
import cpcourse
from cpcourse.attention import attention_with_lse
from cpcourse.dist import shard
from cpcourse.ring import ring_attention

ring_forward = cpcourse.exercise("04.1")  # yours, or the reference while yours is a stub
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 3001, 32, generator=g) for _ in range(3))
mine = [shard(x, rank, world_size) for x in (q, k, v)]
want = shard(attention_with_lse(q.double(), k.double(), v.double())[0], rank, world_size)
err = float((ring_forward(*mine).double() - want).abs().max())
stats = {}
for mode in ("overlap", "blocking"):
    ring_attention(*mine, mode=mode)  # warm-up: thread pools, first-touch pages
    dist.barrier()
    stats[mode] = []
    ring_attention(*mine, mode=mode, stats=stats[mode])
print(f"{mine[0].shape[2]} tokens here; your ring vs float64: max error {err:.1e}", flush=True)
RESULT = {"err": err, "stats": stats, "shape": list(q.shape)}"""),
    ("code", """\
B, H, L, D = run[0]["shape"]
P = len(run)
worst = max(r["err"] for r in run)
say(f"Your ring on {P} processes against one-process float64 attention: worst error "
    f"**{worst:.1e}** over all ranks (float32 rounding; the graded test allows 2e-5 and runs "
    f"P = 1, 2, 3, 4 with a rank that holds no tokens).")
show_table([{"step": s["step"], "rank": s["rank"], "K/V block": s["kv_block"],
             "compute": fmt.seconds(s["compute_s"]), "waiting on comm": fmt.seconds(s["comm_s"]),
             "bytes sent": fmt.nbytes(s["bytes_sent"])}
            for r in run for s in r["stats"]["overlap"] if s["rank"] == 0])"""),
    ("code", """\
cpcourse.check("04.1")"""),
    ("md", """\
## 2. Measured against simulated

The simulator of notebook 03 predicts a timeline from two rates: FLOP/s of the attention
kernel and bytes/s of the link. Both can be read off the blocking run, where compute and
transfer do not overlap: FLOPs over compute seconds, bytes over communication seconds. Fed
back into the simulator with the same schedule, do they reproduce the overlapped run?"""),
    ("code", """\
block_stats = [s for r in run for s in r["stats"]["blocking"]]
flops = sum(4 * s["q_tokens"] * s["kv_tokens"] * D * H * B for s in block_stats)
rate = flops / sum(s["compute_s"] for s in block_stats)
moved = [s for s in block_stats if s["bytes_sent"]]
bw = sum(s["bytes_sent"] for s in moved) / sum(s["comm_s"] for s in moved)
x = torch.zeros(1, 1, P, 2)
events = vr.at_scale(sim.simulate_ring(x, x, x, P).events, L, H * B, D, 4)
simulated = sim.timeline(events, P, rate, bw, overlap=True)
measured = vr.measured_timeline([r["stats"]["overlap"] for r in run])
say(f"Measured here: attention at **{rate / 1e9:.1f} GFLOP/s** per rank, gloo moving "
    f"**{bw / 1e9:.2f} GB/s** between processes on this machine.")
vr.timeline_figure({"measured, overlap": measured, "simulated, overlap": simulated}, P)"""),
    ("code", """\
vr.steps_figure(measured, simulated, P)"""),
    ("code", """\
total = {m: max(sum(s["compute_s"] + s["comm_s"] for s in r["stats"][m]) for r in run)
         for m in ("overlap", "blocking")}
sim_end = max(r["end"] for r in simulated)
say(f"One ring took **{fmt.seconds(total['overlap'])}** overlapped and "
    f"**{fmt.seconds(total['blocking'])}** blocking (slowest rank, one run each); the "
    f"simulator, fed the blocking run's rates, predicts {fmt.seconds(sim_end)} for the "
    f"overlapped one. The simulator assumes each rank owns its core and its link; here {P} "
    f"processes share {os.cpu_count()} cores, and gloo copies the bytes with the same cores that "
    f"compute, so there is little to overlap *with*, and ranks wait for each other. Notebook "
    f"05 measures that with repeats, and shows where overlap pays: a GPU, whose copy engines "
    f"and NVLink run beside the compute units.")"""),
    ("md", """\
## 3. The alternatives: all-gather and Ulysses

The ring is one way to let every query see every key. Two others are common:

* **all-gather** (Llama 3): every rank gathers all K and V once, then makes one attention
  call. Simple, one collective; but every rank holds the whole K/V.
* **Ulysses** (DeepSpeed): one all-to-all turns a *sequence* split into a *head* split (each
  rank gets every token of H/P heads), attention is then purely local, and a second
  all-to-all turns it back. Little data moves, but P must divide the number of heads.

### Exercise 04.2: Ulysses' all-to-all

Write `seq_to_heads(x, group=None)`: `[B, H, L_r, D]` (a sequence shard of every head) to
`[B, H/P, L, D]` (every token of this rank's heads), with one `dist.all_to_all_single`.
The next cell runs it, the three methods on the same inputs (6 heads over 3 ranks), Ulysses
on 4 heads (which 3 ranks cannot split), and the ring of the bug hunt in section 4."""),
    ("code", """\
%%torchrun -n 3 --out alt --timeout 90
import cpcourse
from cpcourse.attention import attention_with_lse
from cpcourse.bytecount import count_bytes
from cpcourse.course import load
from cpcourse.dist import shard
from cpcourse.errors import InputError
from cpcourse.memory import peak_memory
from cpcourse.ring import ring_attention
from cpcourse.ulysses import ulysses_attention

def inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    whole = [torch.randn(*shape, generator=g) for _ in range(3)]
    want = attention_with_lse(*(x.double() for x in whole))[0]
    return whole, [shard(x, rank, world_size) for x in whole], shard(want, rank, world_size)

(q, k, v), mine, want = inputs((1, 6, 1201, 32), seed=1)
methods = {"ring": lambda: ring_attention(*mine, mode="overlap"),
           "all-gather": lambda: ring_attention(*mine, mode="allgather"),
           "Ulysses": lambda: ulysses_attention(*mine)}
rows = {}
for name, fn in methods.items():
    with count_bytes() as sent:
        out = fn()
    _, peak = peak_memory(fn)
    rows[name] = {"err": float((out.double() - want).abs().max()), "sent": sent.total,
                  "peak": peak}
seq_to_heads = cpcourse.exercise("04.2")
hp = q.shape[1] // world_size
heads_err = float((seq_to_heads(mine[0]) - q[:, rank * hp:(rank + 1) * hp]).abs().max())
try:
    ulysses_attention(*(x[:, :4] for x in mine))
    limit = None
except InputError as exc:
    limit = str(exc)
ex04 = load(None, "ex04_ring")  # the bug hunt: the padded ring, even and uneven shards
bug = {}
for label, length in (("even: 9 = 3 + 3 + 3", 9), ("uneven: 7 = 3 + 2 + 2", 7)):
    _, small, small_want = inputs((1, 2, length, 16), seed=length)
    bug[label] = {
        "buggy": float((ex04.ring_forward_padded_buggy(*small).double() - small_want).abs().max()),
        "yours": float((cpcourse.exercise("04.3")(*small).double() - small_want).abs().max())}
RESULT = {"rows": rows, "heads_err": heads_err, "limit": limit, "bug": bug,
          "shape": list(q.shape)}"""),
    ("code", """\
B2, H2, L2, D2 = alt[0]["shape"]
model = costs.comm(L2, P, H2, D2, dtype="fp32", bandwidth_gbps=1.0)
predicted_bytes = {"ring": model["kv_bytes_total"], "all-gather": model["allgather_bytes_per_rank"],
                   "Ulysses": model["ulysses_bytes_per_rank"]}
keys = {"ring": "ring_overlap", "all-gather": "allgather", "Ulysses": "ulysses"}
show_table([{"method": name,
             "max error vs float64": f"{max(r['rows'][name]['err'] for r in alt):.1e}",
             "bytes sent (busiest rank)": fmt.nbytes(max(r["rows"][name]["sent"] for r in alt)),
             "cost model": fmt.nbytes(predicted_bytes[name]),
             "peak tensor memory (busiest rank)": fmt.nbytes(max(r["rows"][name]["peak"]
                                                               for r in alt)),
             "predicted peak": fmt.nbytes(bench_ring.predicted_peak_bytes(keys[name], L2, P,
                                                                          H2, D2))}
            for name in predicted_bytes])
sent = {n: max(r["rows"][n]["sent"] for r in alt) for n in predicted_bytes}
say(f"All three give the same answer. Ulysses sent **{fmt.ratio(sent['ring'] / sent['Ulysses'])}"
    f" fewer** bytes than the ring here (the cost model's ratio is P/2 for K and V against Q, K,"
    f" V and the output, so it grows with P); all-gather sends what the ring sends, but all at "
    f"once, and then holds the whole K/V: its peak memory grows with the *whole* sequence, the "
    f"ring's and Ulysses' with the shard.")"""),
    ("code", """\
say(f"Your `seq_to_heads` against the head slice of the whole q: max difference "
    f"**{max(r['heads_err'] for r in alt):.1e}**.\\n\\n"
    f"And Ulysses with 4 heads on 3 ranks, as every rank reported it:\\n\\n"
    f"> {alt[0]['limit']}")"""),
    ("code", """\
cpcourse.check("04.2")"""),
    ("md", """\
The limit is real in production: Wan2.1-1.3B has 12 heads, so Ulysses cannot run on 8 GPUs and
its README recommends the ring there; Ulysses also stops at P = H. The ring has neither
limit; it pays in bytes. xDiT's "USP" combines both: Ulysses inside a group that divides the
heads, the ring across groups.

## 4. Bug hunt: the padded ring

Gloo's collectives want equal sizes, and equal buffers are easy to reuse, so someone wrote
`ring_forward_padded_buggy` (in your exercise file): it pads every rank's K/V block with zeros
to the longest shard, then runs the ring. Its author tested it on 9 tokens over 3 ranks, and
it passed. The launch above also ran it on 7 tokens:"""),
    ("code", """\
show_table([{"shards": label,
             "buggy ring: max error": f"{max(r['bug'][label]['buggy'] for r in alt):.1e}",
             "your ring_forward_padded": f"{max(r['bug'][label]['yours'] for r in alt):.1e}"}
            for label in alt[0]["bug"]])"""),
    ("md", """\
### Exercise 04.3: find the bug, fix it

Perfect on even shards, wrong on uneven ones, and no error anywhere. Read
`ring_forward_padded_buggy` and ask what a row of zeros in K does inside a softmax. Then write
`ring_forward_padded`: the same padded messages, the right answer. (The test that passed was
too weak: a test of distributed code needs lengths that P does not divide, and a length
smaller than P.)"""),
    ("code", """\
cpcourse.check("04.3")"""),
    ("md", """\
## Worked questions

**Q1.** In the table of section 3, why does all-gather's peak memory exceed the ring's even at
this small size, and how would the gap grow at P = 8? **Q2.** A zero key scores 0 against
every query. Why is that not "no key"? **Q3.** Ulysses on 40 heads (Wan2.1-14B): which P up
to 16 can it use?"""),
    ("code", """\
ag = [bench_ring.predicted_peak_bytes(m, L2, 8, H2, D2) for m in ("allgather", "ring_overlap")]
works = [p for p in range(1, 17) if 40 % p == 0]
say(f"**A1.** All-gather holds the gathered K/V of all {P} ranks plus the whole K/V cut out of "
    f"it; the ring holds two blocks. At P = 8 on the same sequence the model predicts "
    f"{fmt.nbytes(ag[0])} against {fmt.nbytes(ag[1])} ({fmt.ratio(ag[0] / ag[1])}).\\n\\n"
    f"**A2.** exp(0 − lse) is not 0: each padded key takes a share of the softmax and adds "
    f"nothing (its value is 0) to the output, so every output row shrinks.\\n\\n"
    f"**A3.** P ∈ {works}; beyond that, the ring (or USP).")"""),
    ("md", """\
Next, notebook 05: when does the ring's communication hide behind its compute, on a GPU box,
and what would the seed article's 6.2 GB example really cost?"""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
