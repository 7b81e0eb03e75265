"""python tools/notebooks/build_03.py: write notebooks/03_ring_simulated.ipynb (no outputs).

Authored as a list of cells so that it stays reviewable as text; every number the notebook
states is printed by a code cell from `cpcourse`. `--check` exits 1 when the committed notebook
differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("03_ring_simulated.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 03 · The ring, simulated

Notebook 02 computed attention block by block on one device: a running output and its
log-sum-exp (lse), folded together with `merge_attention`, give the exact answer without ever
holding the whole score matrix. That fixed the *memory of the scores*. It did not fix the
*memory and time of one device*: a 75k-token video still has to fit, and be computed, on it.

Context parallelism splits the sequence over P devices. Each rank keeps a shard of the queries,
keys and values. Its queries need **every** key, though, and most keys live elsewhere. This
notebook builds the ring that brings them, on P *virtual* ranks in this one process
(`cpcourse.sim`), where every step can be looked at:

1. why the obvious fix (every rank gathers all K/V) is not the one we want;
2. the ring: the schedule (exercise 03.1), checked against a simulated trace;
3. three pictures of it: the block grid, the K/V blocks travelling, a per-rank timeline;
4. bytes per rank, for any P, and what the timeline says about hiding the transfers.

Notebook 04 runs the same ring on real processes."""),
    ("code", """\
%matplotlib inline
import ipywidgets as widgets
import torch
from IPython.display import display

import cpcourse
from cpcourse import costs, sim
from cpcourse.attention import attention_with_lse
from cpcourse.course import exercise
from cpcourse.dist import shard_sizes
from cpcourse.hardware import get_gpu, links
from cpcourse.viz import fmt
from cpcourse.viz import ring as vr
from cpcourse.viz.fmt import say, show_table"""),
    ("md", """\
## 1. The obvious fix, and its price

Give rank r its queries, and let it **gather every other rank's K and V** first; then one
attention call finishes the job. Llama 3 does this for training. Here is what a rank must hold,
for a video-sized sequence (Wan2.1-14B at 720p: 75,600 tokens, 40 heads of 128, bf16), from
the course's cost model:"""),
    ("code", """\
N, HEADS, HEAD_DIM = 75600, 40, 128
rows = []
for p in (2, 4, 8, 16):
    c = costs.comm(N, p, HEADS, HEAD_DIM, link="nvlink4", gpu="h100")
    rows.append({"P": p, "tokens per rank": fmt.count(c["tokens_per_rank"]),
                 "all-gather: K/V held per rank": fmt.nbytes(c["allgather_kv_bytes_held_per_rank"]),
                 "ring: K/V held per rank": fmt.nbytes(c["ring_kv_bytes_held_per_rank"])})
show_table(rows)
c8 = costs.comm(N, 8, HEADS, HEAD_DIM, link="nvlink4", gpu="h100")
say(f"All-gather makes every rank hold the **whole** K and V, "
    f"{fmt.nbytes(c8['allgather_kv_bytes_held_per_rank'])} per layer whatever P is: splitting "
    f"the sequence stopped dividing the memory. The ring holds two K/V blocks at a time "
    f"(the one it computes on and the one arriving): "
    f"{fmt.nbytes(c8['ring_kv_bytes_held_per_rank'])} at P = 8, and it keeps falling with P.")"""),
    ("md", """\
## 2. The ring

Put the P ranks on a ring. At step 0 each rank attends its queries to its **own** K/V block.
Then every rank passes the block it holds to rank r + 1 and takes the one rank r − 1 held.
After P − 1 passes every query has seen every key block exactly once; each partial result is
folded in with the lse merge of notebook 02, so the order in which the blocks arrive does not
matter. No rank ever holds more than two blocks.

`sim.simulate_ring(q, k, v, P)` runs exactly that on P virtual ranks, with the same attention
and merge code the real ring uses, and records a trace. First, is it right? 10 tokens over 4
ranks is an uneven split on purpose:"""),
    ("code", """\
P, L = 4, 10
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, L, 8, generator=g, dtype=torch.float64) for _ in range(3))
res = sim.simulate_ring(q, k, v, P)
want, _ = attention_with_lse(q, k, v)
say(f"Shards {res.shard_sizes} tokens; ring vs one-process attention (float64): max difference "
    f"**{float((res.out - want).abs().max()):.1e}**; the trace has {len(res.events)} events.")
show_table([{"kind": e.kind, "step": e.step, "rank": e.rank, "K/V block": e.kv_block,
             "peer": e.peer if e.peer >= 0 else "", "bytes": e.nbytes or ""}
            for e in res.events if e.step == 1])"""),
    ("md", """\
That is ring step 1: four computes (each rank on someone else's block), four sends and four
receives. Nothing about which block is where was written into the simulator: it emerges from
the passing.

### Exercise 03.1: the schedule

Real implementations do not simulate: each rank must *know*, at step s, which block it holds,
whom to send to and whom to receive from, and how long the incoming block is (to allocate a
buffer for it). Write `ring_step(step, world)` in `exercises/ex03_ring_schedule.py`. The cell
below sets your schedule beside the simulator's trace, for P = 1 to 7."""),
    ("code", """\
ring_step = exercise("03.1")
mismatches = []
for world in range(1, 8):
    trace = sim.simulate_ring(q[:, :, :world], k[:, :, :world], v[:, :, :world], world).events
    held = {(e.step, e.rank): e.kv_block for e in trace if e.kind == "compute"}
    sends = {(e.step, e.rank): e.peer for e in trace if e.kind == "send"}
    for step in range(world):
        for row in ring_step(step, world):
            key = (step, row["rank"])
            if row["holds"] != held[key] or row["send_to"] != sends.get(key):
                mismatches.append(key)
show_table([{f"rank {row['rank']}": f"holds {row['holds']}, sends to {row['send_to']}"
             for row in ring_step(s, P)} | {"step": s} for s in range(P)])
say(f"Your schedule against the simulated trace, P = 1..7: **{len(mismatches)}** mismatches.")"""),
    ("code", """\
cpcourse.check("03.1")"""),
    ("md", """\
## 3. Three pictures of the ring

**The block grid.** Row = a rank's queries, column = a K/V block; the number is the step at
which that pair is computed. Each step is a wrapped diagonal: all P ranks are busy at every
step, and all P² pairs are covered once."""),
    ("code", """\
vr.grid_figure(res.events, P)"""),
    ("md", """\
**The blocks travelling.** Follow one colour: K/V block 0 starts on rank 0 and moves one rank
down (around the ring) per step. The last step sends nothing: the block held then is the last
one needed."""),
    ("code", """\
vr.travel_figure(res.events, P)"""),
    ("md", """\
Nothing here depends on P = 4: the same pictures for 7 ranks (and for any P with the slider
of section 5, which redraws the travel diagram too)."""),
    ("code", """\
x7 = torch.zeros(1, 1, 7, 2)
vr.grid_figure(sim.simulate_ring(x7, x7, x7, 7).events, 7)"""),
    ("md", """\
## 4. Bytes per rank

Each hop moves one K/V block: K and V, every head, `2 · L_r · H · D · bytes` bytes. A rank
sends P − 1 of them. The trace counts what each virtual rank put in the mailbox:"""),
    ("code", """\
sent = sim.bytes_sent(res.events, P)
elem, heads, dim = q.element_size(), q.shape[1], q.shape[3]
formula = [sum(2 * n * heads * dim * elem for j, n in enumerate(res.shard_sizes)
               if j != (r + 1) % P) for r in range(P)]
show_table([{"rank": r, "shard tokens": res.shard_sizes[r], "bytes sent (trace)": sent[r],
             "2 · L_j · H · D · bytes over the blocks it forwards": formula[r]}
            for r in range(P)])
say(f"Trace and formula agree on every rank: **{sent == formula}**. With uneven shards the "
    f"ranks send different amounts: rank r forwards every block except the one rank r + 1 "
    f"owns (that one stops there).")"""),
    ("md", """\
At real size the cost model counts the busiest rank (the one with ⌈N/P⌉ tokens). For the
Wan2.1-14B sequence above, per attention layer:"""),
    ("code", """\
rows = []
for p in (2, 4, 8, 16):
    c = costs.comm(N, p, HEADS, HEAD_DIM, link="nvlink4", gpu="h100")
    rows.append({"P": p, "bytes per hop": fmt.nbytes(c["kv_bytes_per_hop"]),
                 "hops": c["ring_hops"], "bytes sent per rank": fmt.nbytes(c["kv_bytes_total"])})
show_table(rows)
c2, c16 = (costs.comm(N, p, HEADS, HEAD_DIM, link="nvlink4", gpu="h100") for p in (2, 16))
say(f"Each rank sends about 2·N·H·D·bytes·(P−1)/P in total: "
    f"{fmt.nbytes(c2['kv_bytes_total'])} at P = 2 and {fmt.nbytes(c16['kv_bytes_total'])} at "
    f"P = 16, never more than the whole K and V. Adding ranks does not cut a rank's traffic; "
    f"it cuts each hop ({fmt.nbytes(c2['kv_bytes_per_hop'])} → "
    f"{fmt.nbytes(c16['kv_bytes_per_hop'])}), and with it the compute each hop has to hide "
    f"behind, which falls faster (P² blocks share the same total work).")"""),
    ("md", """\
## 5. A per-rank timeline: can the transfers hide?

Moving bytes takes time. If a rank waits for the next block before computing on it
(**blocking**), every transfer adds up. If it starts the transfer and computes on the current
block meanwhile (**overlap**), a step costs max(compute, transfer). `sim.timeline` turns the
trace into start and end times from a compute rate and a link bandwidth; `vr.at_scale` gives
the simulated trace the sizes of a real workload (the schedule stays the simulator's).
Pick a sequence length, a link and P (the travel diagram is redrawn for your P): H100 at the
cost model's attention efficiency, 40 heads of 128, bf16."""),
    ("code", """\
h100 = get_gpu("h100")
LINKS = {lk.name: lk for lk in links().values()}

def ring_timeline(tokens=75600, P=8, link=links()["ib-ndr"].name):
    x = torch.zeros(1, 1, P, 2)
    events = vr.at_scale(sim.simulate_ring(x, x, x, P).events, tokens, HEADS, HEAD_DIM, 2)
    rate, bw = h100.attention_flops(), LINKS[link].effective_gbps * 1e9
    over = sim.timeline(events, P, rate, bw, overlap=True)
    block = sim.timeline(events, P, rate, bw, overlap=False)
    end = lambda rows: max(r["end"] for r in rows)  # noqa: E731
    say(f"{fmt.count(tokens)} tokens on P = {P} over {link}: overlapped "
        f"**{fmt.seconds(end(over))}**, blocking **{fmt.seconds(end(block))}** per layer.")
    display(vr.image(vr.travel_figure(events, P)))  # the schedule, for your P
    return vr.image(vr.timeline_figure({"overlap": over, "blocking": block}, P))

widgets.interact(ring_timeline,
                 tokens=widgets.IntSlider(value=75600, min=8000, max=432000, step=400),
                 P=widgets.IntSlider(value=8, min=2, max=16),
                 link=widgets.Dropdown(options=list(LINKS), value=links()["ib-ndr"].name));"""),
    ("code", """\
def gap(tokens, p, link_id):
    # seconds of one layer's ring: overlapped, blocking, and compute alone
    x = torch.zeros(1, 1, p, 2)
    ev = vr.at_scale(sim.simulate_ring(x, x, x, p).events, tokens, HEADS, HEAD_DIM, 2)
    bw = links()[link_id].effective_gbps * 1e9
    return [max(r["end"] for r in sim.timeline(ev, p, h100.attention_flops(), b, overlap=o))
            for b, o in ((bw, True), (bw, False), (1e30, True))]

nv, ib, ib32 = gap(N, 8, "nvlink4"), gap(N, 8, "ib-ndr"), gap(N, 32, "ib-ndr")
show_table([{"case": name, "overlapped": fmt.seconds(a), "blocking": fmt.seconds(b),
             "compute alone": fmt.seconds(c), "hidden": "yes" if a <= c * 1.001 else "no"}
            for name, (a, b, c) in (("NVLink 4, P = 8", nv), ("InfiniBand NDR, P = 8", ib),
                                    ("InfiniBand NDR, P = 32", ib32))])
say(f"At {fmt.count(N)} tokens, overlap makes the ring cost what its compute costs when the "
    f"link is fast enough (NVLink, P = 8: {fmt.seconds(nv[0])}, compute alone "
    f"{fmt.seconds(nv[2])}). Over one InfiniBand NIC per GPU it does not: overlapped "
    f"{fmt.seconds(ib[0])} against {fmt.seconds(ib[2])} of compute at P = 8, and at P = 32 the "
    f"transfers set the pace ({fmt.seconds(ib32[0])} vs {fmt.seconds(ib32[2])}). Notebook 05 "
    f"works out exactly where that line lies.")"""),
    ("md", """\
## Worked questions

**Q1.** With P ranks, how many of the P² block pairs does a rank compute, and at how many
steps does it send? **Q2.** 10 tokens on 4 ranks: which rank sends the most bytes, and why?
**Q3.** Why may a rank start the transfer of block s + 1 *before* it has finished computing
on block s, but not reuse block s's buffer for the block after?"""),
    ("code", """\
most = max(range(P), key=lambda r: sent[r])
say(f"**A1.** P pairs (its row of the grid), and P − 1 sends (steps 0 .. P − 2).\\n\\n"
    f"**A2.** Rank {most}, {sent[most]} bytes: shards {res.shard_sizes}; a rank forwards every "
    f"block except its successor's, so the rank whose successor holds the smallest block "
    f"forwards the most.\\n\\n"
    f"**A3.** Computing only *reads* the block it holds, so sending it at the same time is safe; "
    f"the receive writes a *different* buffer. Overwriting the block still being sent (or "
    f"read by the attention kernel) would corrupt it, so the real ring (notebook 04) keeps two "
    f"buffers and uses them in turn.")"""),
    ("md", """\
Next, notebook 04: the same ring on real processes, your own version of it, and the two
alternatives (all-gather and Ulysses) measured side by side."""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
