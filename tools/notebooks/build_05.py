"""python tools/notebooks/build_05.py: write notebooks/05_communication_and_overlap.ipynb.

The notebook is written without outputs.

Authored as a list of cells so that it stays reviewable as text; every number the notebook
states is printed by a code cell from `cpcourse`. `--check` exits 1 when the committed notebook
differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("05_communication_and_overlap.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 05 · Communication and overlap

Notebooks 03 and 04 drew timelines in which the next K/V block travels while the current one
is computed. Whether that hides the transfer is a question of two numbers: how long one ring
step computes, and how long one hop takes. This notebook answers it with arithmetic, checks
the arithmetic against a run on this machine, and then applies it where it matters:

1. the **overlap condition** (exercise 05.1) and the smallest shard that hides the ring;
2. the cost model against a small measurement on **this** CPU, and why overlap gains little
   here;
3. **NVLink vs InfiniBand vs PCIe**: when the ring hides and when it does not (a slider);
4. the seed article's **6.2 GB / 14 ms** example, done right: per hop and per layer."""),
    ("code", """\
%matplotlib inline
%load_ext cpcourse
import os
import statistics

import ipywidgets as widgets

import cpcourse
from cpcourse import costs
from cpcourse.course import exercise
from cpcourse.hardware import gpus, links
from cpcourse.tokens import get_model, video_tokens
from cpcourse.viz import fmt, seed
from cpcourse.viz import ring as vr
from cpcourse.viz.fmt import say, show_table"""),
    ("md", """\
## 1. The overlap condition

One ring step on a rank: its Lq queries attend to a visiting block of Lk = Lq keys, for all H
heads of dimension D. That is `4 · Lq² · D · H` FLOPs (QKᵀ and PV, 2 FLOPs per multiply-add).
Meanwhile the next block travels one hop: K and V of Lq tokens, `2 · Lq · D · H · b` bytes
(b bytes per element). With a kernel at F FLOP/s and a link at B bytes/s:

    compute / comm = (4 Lq² D H / F) / (2 Lq D H b / B) = 2 · Lq · B / (F · b)

H and D cancel. The ratio grows with the tokens a rank holds, and the transfer hides once
`Lq ≥ F · b / (2 B)`. Fewer tokens per rank (more ranks, a shorter video) make the ring
communication-bound, however fast the kernel.

### Exercise 05.1: is it hidden?

Write `overlap_condition(tokens_per_rank, heads, head_dim, bytes_per_element, flops_per_s,
bytes_per_s)` in `exercises/ex05_overlap.py`. The cell uses it on an H100 over NVLink 4 with
Wan2.1-14B's 720p sequence on 8 GPUs."""),
    ("code", """\
overlap_condition = exercise("05.1")
wan = get_model("wan2.1-t2v-14b")
h100, nv4 = gpus()["h100-sxm"], links()["nvlink4"]
N_WAN = costs.comm(75600, 1, wan.heads, wan.head_dim, link="nvlink4")["tokens"]
lq = max(costs.shard_sizes(N_WAN, 8))
r = overlap_condition(lq, wan.heads, wan.head_dim, 2, h100.attention_flops(),
                      nv4.effective_gbps * 1e9)
say(f"{fmt.count(lq)} tokens per GPU, {wan.heads} heads of {wan.head_dim}, bf16: one step "
    f"computes for **{fmt.seconds(r['compute_s'])}**, one hop takes "
    f"**{fmt.seconds(r['comm_s'])}**; hidden: **{r['hidden']}**. The ring hides from "
    f"**{fmt.count(r['min_tokens_per_rank'])}** tokens per GPU on this GPU and link.")"""),
    ("code", """\
cpcourse.check("05.1")"""),
    ("md", """\
## 2. The model against this machine

A model is worth what it predicts. The next cell runs the library's ring on 2 processes, 3
times in each mode (overlap, blocking), and keeps every step's compute time, time spent in
communication calls, and bytes. From the blocking runs (nothing overlaps there) come this
machine's F and B; the model then predicts each step of the overlapped run."""),
    ("code", """\
%%torchrun -n 2 --out meas --timeout 90
from cpcourse.dist import shard
from cpcourse.ring import ring_attention

g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 2048, 64, generator=g) for _ in range(3))
mine = [shard(x, rank, world_size) for x in (q, k, v)]
ring_attention(*mine)  # warm-up
runs = {"overlap": [], "blocking": []}
for _ in range(3):
    for mode in runs:  # interleaved, so both modes see the same machine load
        dist.barrier()
        stats = []
        ring_attention(*mine, mode=mode, stats=stats)
        runs[mode].append(stats)
RESULT = {"runs": runs, "shape": list(q.shape)}"""),
    ("code", """\
B, H, L, D = meas[0]["shape"]
P = len(meas)
def med(mode, step, key):  # median over the 3 runs of the slowest rank's value
    return statistics.median(max(r["runs"][mode][i][step][key] for r in meas) for i in range(3))

lq_here = max(costs.shard_sizes(L, P))
f_here = 4 * lq_here * lq_here * D * H * B / med("blocking", 0, "compute_s")
b_here = meas[0]["runs"]["blocking"][0][0]["bytes_sent"] / med("blocking", 0, "comm_s")
model = overlap_condition(lq_here, H * B, D, 4, f_here, b_here)
show_table([
    {"": "one step's compute", "model (rates of the blocking run)": fmt.seconds(model["compute_s"]),
     "blocking run": fmt.seconds(med("blocking", 0, "compute_s")),
     "overlapped run": fmt.seconds(med("overlap", 0, "compute_s"))},
    {"": "one hop's communication (overlapped: the part not hidden)",
     "model (rates of the blocking run)": fmt.seconds(model["comm_s"]),
     "blocking run": fmt.seconds(med("blocking", 0, "comm_s")),
     "overlapped run": fmt.seconds(med("overlap", 0, "comm_s"))},
    {"": "step 0 in all",
     "model (rates of the blocking run)": fmt.seconds(max(model["compute_s"], model["comm_s"])),
     "blocking run": fmt.seconds(med("blocking", 0, "compute_s") + med("blocking", 0, "comm_s")),
     "overlapped run": fmt.seconds(med("overlap", 0, "compute_s")
                                   + med("overlap", 0, "comm_s"))}])"""),
    ("code", """\
slow = med("overlap", 0, "compute_s") / med("blocking", 0, "compute_s")
step_b = med("blocking", 0, "compute_s") + med("blocking", 0, "comm_s")
step_o = med("overlap", 0, "compute_s") + med("overlap", 0, "comm_s")
say(f"This machine: attention at **{f_here / 1e9:.1f} GFLOP/s** per rank, gloo at "
    f"**{b_here / 1e9:.2f} GB/s** between two processes; compute / comm = "
    f"{fmt.ratio(model['compute_s'] / model['comm_s'])} at {fmt.count(lq_here)} tokens per "
    f"rank, and the model's threshold is {fmt.count(model['min_tokens_per_rank'])} tokens.\\n\\n"
    f"The model's overlapped step, max(compute, comm), is "
    f"{fmt.seconds(max(model['compute_s'], model['comm_s']))}; the measured one took "
    f"**{fmt.seconds(step_o)}** against {fmt.seconds(step_b)} blocking: overlap saved "
    f"**{fmt.seconds(step_b - step_o)}** of the {fmt.seconds(med('blocking', 0, 'comm_s'))} "
    f"the transfer costs when nothing hides it. Look at the first row: with the transfer "
    f"running beside it, the same attention took **{slow:.2f}×** its blocking time. On a CPU, "
    f"gloo moves the bytes with memcpy on the same {os.cpu_count()} cores (and the same memory "
    f"bandwidth) that compute, so what overlap takes off the communication it largely adds "
    f"back to the compute; it can only hide work that runs on *other* hardware. On a GPU, "
    f"NCCL's transfers run on copy engines and NVLink while the SMs compute: the case the "
    f"model describes.")"""),
    ("md", """\
## 3. NVLink vs InfiniBand vs PCIe

Those three links differ by an order of magnitude, and the threshold `F · b / (2 B)` moves
with them. The cost model's achievable rates (attention efficiency per GPU, link efficiency
from measurements; see `cpcourse.hardware`), bf16:"""),
    ("code", """\
rows = []
for lid in ("nvlink4", "nvlink5", "pcie5", "pcie4", "ib-ndr", "ib-hdr"):
    row = {"link": links()[lid].name,
           "GB/s achievable": f"{links()[lid].effective_gbps:.1f}"}
    for gid in ("a100-80gb-sxm", "h100-sxm", "b200"):
        c = costs.comm(1024, 1, 1, 128, link=lid, gpu=gid)
        row[f"{gpus()[gid].name.split()[1]}: tokens/GPU to hide"] = fmt.count(
            c["min_tokens_per_rank_to_hide"])
    rows.append(row)
show_table(rows)
t_nv = costs.comm(N_WAN, 8, wan.heads, wan.head_dim, link="nvlink4", gpu="h100")
t_ib = costs.comm(N_WAN, 8, wan.heads, wan.head_dim, link="ib-ndr", gpu="h100")
say(f"Wan2.1-14B at 720p on 8 H100s holds {fmt.count(t_nv['tokens_per_rank'])} tokens per GPU. "
    f"Over NVLink compute / comm = **{fmt.ratio(t_nv['compute_to_comm_ratio'])}**: hidden. "
    f"Over one NDR NIC per GPU (8 GPUs on 8 nodes) it is "
    f"**{fmt.ratio(t_ib['compute_to_comm_ratio'])}**, hidden: {t_ib['hidden']}. The ring belongs "
    f"inside the NVLink domain; across nodes it needs "
    f"{fmt.count(t_ib['min_tokens_per_rank_to_hide'])} tokens per GPU, which few videos have.")"""),
    ("md", """\
Move the sliders: a GPU, a link, a sequence and a CP degree. The figure shows compute / comm
of one ring step against tokens per GPU for every link (above 1: hidden); the vertical line is
your configuration."""),
    ("code", """\
GPU_NAMES = {g.name: gid for gid, g in gpus().items()}
LINK_NAMES = {lk.name: lid for lid, lk in links().items()}

def hiding(gpu=gpus()["h100-sxm"].name, link=links()["ib-ndr"].name, tokens=75600, P=8):
    c = costs.comm(tokens, P, wan.heads, wan.head_dim, link=LINK_NAMES[link],
                   gpu=GPU_NAMES[gpu])
    verdict = "hidden" if c["hidden"] else "NOT hidden: the ring waits on the link"
    say(f"{fmt.count(c['tokens_per_rank'])} tokens per GPU: step compute "
        f"{fmt.seconds(c['compute_seconds_per_step'])}, hop "
        f"{fmt.seconds(c['comm_seconds_per_hop'])}: **{verdict}**. Smallest shard that hides: "
        f"**{fmt.count(c['min_tokens_per_rank_to_hide'])} tokens per GPU**, i.e. at P = {P} a "
        f"sequence of at least {fmt.count(c['min_tokens_per_rank_to_hide'] * P)} tokens.")
    xs = [2 ** i for i in range(8, 18)]
    curves = [{"label": lk.name, "tokens": xs,
               "ratio": [costs.comm(x, 1, 1, 128, link=lid, gpu=GPU_NAMES[gpu])[
                   "compute_seconds_per_step"] / costs.comm(x, 1, 1, 128, link=lid,
                   gpu=GPU_NAMES[gpu])["comm_seconds_per_hop"] for x in xs]}
              for lid, lk in links().items()]
    return vr.image(vr.hide_figure(curves, {"you": c["tokens_per_rank"]}))

widgets.interact(hiding, gpu=widgets.Dropdown(options=list(GPU_NAMES)),
                 link=widgets.Dropdown(options=list(LINK_NAMES), value=links()["ib-ndr"].name),
                 tokens=widgets.IntSlider(value=75600, min=4000, max=432000, step=400),
                 P=widgets.IntSlider(value=8, min=2, max=64));"""),
    ("md", """\
## 4. The seed article's example, done right

The article that started this course puts a long 720p clip on 8 GPUs over NVLink, adds up
the K/V the ring sends, converts it to milliseconds at the link's rate, and compares that with
the compute of a ring step (its figures are in `cpcourse.viz.seed.ARTICLE`, quoted below).
Its arithmetic is right; the comparison is not: the bytes are all hops together, set against
the compute of *one* step. Per hop against per step, with the kernel at 75% of the H100's peak
(FlashAttention-3 class):"""),
    ("code", """\
a = seed.ARTICLE
say(f"The article: {fmt.count(a['tokens_5s'])} tokens on {a['cp']} GPUs "
    f"({fmt.count(a['tokens_per_rank'])} each), {a['heads']} heads of {a['head_dim']}, fp16; "
    f"the ring sends about {fmt.nbytes(a['kv_bytes_total'])}, which takes about "
    f"{fmt.seconds(a['comm_seconds_total'])} at {a['link_GBps']} GB/s; \\"if each ring step's "
    f"compute takes {fmt.seconds(a['compute_seconds_per_step'])}+, the communication is fully "
    f"hidden\\".")"""),
    ("code", """\
c = costs.comm(a["tokens_5s"], a["cp"], a["heads"], a["head_dim"], dtype="fp16",
               bandwidth_gbps=a["link_GBps"], gpu="h100", attention_efficiency=0.75,
               layers=get_model(seed.SEED_MODEL).layers)
show_table([
    {"quantity": "K/V per hop (all heads)", "article": fmt.nbytes(a["kv_bytes_per_hop"]),
     "computed": fmt.nbytes(c["kv_bytes_per_hop"])},
    {"quantity": f"K/V over the {c['ring_hops']} hops, per layer",
     "article": fmt.nbytes(a["kv_bytes_total"]), "computed": fmt.nbytes(c["kv_bytes_total"])},
    {"quantity": f"time of the {c['ring_hops']} hops at {a['link_GBps']} GB/s",
     "article": fmt.seconds(a["comm_seconds_total"]),
     "computed": fmt.seconds(c["comm_seconds_total"])},
    {"quantity": "time of ONE hop", "article": "",
     "computed": fmt.seconds(c["comm_seconds_per_hop"])},
    {"quantity": "compute of one ring step", "article": "more than "
     + fmt.seconds(a["compute_seconds_per_step"]),
     "computed": fmt.seconds(c["compute_seconds_per_step"])},
    {"quantity": f"K/V sent per GPU per forward ({c['layers']} layers)", "article": "",
     "computed": fmt.nbytes(c["kv_bytes_per_forward"])}])
say(f"Per step, compute ({fmt.seconds(c['compute_seconds_per_step'])}) is "
    f"**{fmt.ratio(c['compute_to_comm_ratio'])}** the hop "
    f"({fmt.seconds(c['comm_seconds_per_hop'])}): "
    f"the ring hides with a far larger margin than the article's comparison suggests, and its "
    f"estimate of {fmt.seconds(a['compute_seconds_per_step'])} undershoots the step "
    f"{fmt.ratio(c['compute_seconds_per_step'] / a['compute_seconds_per_step'])}. "
    f"What the article leaves out is scale: {fmt.nbytes(c['kv_bytes_total'])} is one attention "
    f"layer of one forward pass on one GPU; a {c['layers']}-layer model sends "
    f"{fmt.nbytes(c['kv_bytes_per_forward'])} per GPU per forward (twice that with CFG).")"""),
    ("code", """\
n4 = video_tokens(a["height"], a["width"], a["fps"] * a["seconds"] + 1, vae_temporal=4)
vae4 = costs.comm(n4.sequence_length, a["cp"], a["heads"], a["head_dim"], dtype="fp16",
                  bandwidth_gbps=a["link_GBps"], gpu="h100", attention_efficiency=0.75)
ib = costs.comm(a["tokens_5s"], a["cp"], a["heads"], a["head_dim"], dtype="fp16",
                link="ib-ndr", gpu="h100", attention_efficiency=0.75)
say(f"With a real 4× temporal VAE the same clip ({n4.frames} frames, {n4.latent_frames} "
    f"latent) is {fmt.count(vae4['tokens'])} tokens, {fmt.count(vae4['tokens_per_rank'])} per "
    f"GPU: step {fmt.seconds(vae4['compute_seconds_per_step'])} vs hop "
    f"{fmt.seconds(vae4['comm_seconds_per_hop'])}, still hidden "
    f"({fmt.ratio(vae4['compute_to_comm_ratio'])}). The article's workload over one NDR NIC per "
    f"GPU instead of NVLink: {fmt.ratio(ib['compute_to_comm_ratio'])}, hidden: "
    f"{ib['hidden']}.")"""),
    ("md", """\
## Worked questions

**Q1.** Double the heads of a model: does the ring hide more, less, or the same? **Q2.** An
H100 box over PCIe Gen5 (no NVLink), P = 8: how many tokens must the sequence have for the
ring to hide? **Q3.** Why did overlap gain little in section 2, and what would you change to
make it gain on a CPU?"""),
    ("code", """\
pc = costs.comm(1024, 1, 1, 128, link="pcie5", gpu="h100")
say(f"**A1.** The same: H and D cancel in compute / comm; both sides double.\\n\\n"
    f"**A2.** {fmt.count(pc['min_tokens_per_rank_to_hide'])} tokens per GPU, so at least "
    f"{fmt.count(pc['min_tokens_per_rank_to_hide'] * 8)} tokens over 8 GPUs.\\n\\n"
    f"**A3.** The transfer ran on the cores that compute (beside it the same attention took "
    f"{slow:.2f}× its blocking time). Overlap pays when the bytes move on other hardware: a "
    f"NIC with RDMA, a GPU's copy engines, or cores left free for communication.")"""),
    ("md", """\
Next, notebook 06: video tokens have a shape, T frames × S tokens per frame, and splitting
along time opens a cheaper road for some attention patterns."""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
