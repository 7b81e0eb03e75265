"""python tools/notebooks/build_06.py: write notebooks/06_video_temporal_cp.ipynb (no outputs).

Authored as a list of cells so that it stays reviewable as text; every number the notebook
states is printed by a code cell from `cpcourse`. `--check` exits 1 when the committed notebook
differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("06_video_temporal_cp.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 06 · Video tokens and temporal CP

Notebooks 03 to 05 split one long sequence over P ranks and passed K/V blocks around a ring.
A video is not just a long sequence: its tokens sit on a grid of **T latent frames × S tokens
per frame**. That grid gives a second, cheaper way to split the work, and it is what this
notebook is about:

1. the video layout `[B, H, T, S, D]` and the **split along time** (exercise 06.1) and back (06.2);
2. **spatial attention** (within a frame) needs no communication at all under a T split;
3. **temporal attention** (across frames) by an **all-to-all** (06.3) or by a **ring**, with the
   bytes each really sends, measured, set beside the cost model's prediction;
4. **full 3D attention** (every token with every token) on a T-sharded video (06.4);
5. a bug hunt: **text tokens** that every rank holds and that must enter the softmax once (06.5).

Everything runs on real processes (gloo on this CPU). *Run → Run All Cells*: unsolved exercises
fall back to the reference with a notice."""),
    ("code", """\
%matplotlib inline
import ipywidgets as widgets
import torch

import cpcourse
from cpcourse import video, video_costs
from cpcourse.course import exercise
from cpcourse.launch import launch
from cpcourse.tokens import facts
from cpcourse.video_lab import summarize, whole_video
from cpcourse.viz import fmt
from cpcourse.viz import video as vv
from cpcourse.viz.fmt import say, show_table"""),
    ("md", """\
## 1. Which real models split which axis

Production video DiTs made different choices, and the choice follows the attention they use.
The course's fact sheet records what each model's own code does:"""),
    ("code", """\
models = {m["id"]: m for m in facts()["models"]}
picked = ["open-sora-1.0-stdit", "cosmos-1.0-diffusion-7b", "hunyuanvideo-13b", "wan2.1-t2v-14b"]
show_table([{"model": models[i]["name"], "attention": models[i]["attention"],
             "official multi-GPU inference (from the model's code)": models[i]["parallel"]}
            for i in picked])"""),
    ("md", """\
Read the last column: Open-Sora 1.0 (factored attention) splits **time** and does its temporal
attention with an all-to-all; Cosmos splits **time** too but attends over all tokens at once,
with a ring of K/V exchanges; HunyuanVideo splits **height**; Wan splits the flattened
sequence, which in (t, h, w) order is time-major. This notebook builds the first two.

## 2. The layout, and the split along time

We keep the `[B, H, L, D]` layout of attention and unfold L into (T, S): q, k, v are
`[B, H, T, S, D]`. Flattened in (t, s) order, a contiguous shard of the sequence is a run of
whole frames. Under CP rank r holds frames `tensor_split(range(T), P)[r]`: the first `T % P`
ranks hold one frame more, and a rank may hold none when T < P."""),
    ("code", """\
B, H, T, S, D = 1, 6, 7, 10, 16    # 7 latent frames of 10 tokens, 6 heads: small on purpose
P = 3                              # 7 frames over 3 ranks: an uneven split
q, k, v = whole_video((B, H, T, S, D))
say(f"q is `{list(q.shape)}` = [B, H, T, S, D]: {T} frames × {S} tokens = **{T * S} tokens**; "
    f"flattened it is `{list(video.flatten_video(q).shape)}`.")"""),
    ("md", """\
### Exercise 06.1: split a video along time

Open `exercises/ex06_video_cp.py` and write `shard_frames(video, rank, world)`: rank `rank`'s
frames and the global index of its first frame (you will need that index for rotary positions
in notebook 07). The cell below uses your function (or the reference, while yours is a stub)."""),
    ("code", """\
shard_frames = exercise("06.1")
for r in range(P):
    local, t0 = shard_frames(q, r, P)
    print(f"rank {r}: frames {t0} .. {t0 + local.shape[2] - 1}   local q {list(local.shape)}")
vv.split_figure(T, S, P)"""),
    ("code", """\
cpcourse.check("06.1")"""),
    ("md", """\
## 3. Spatial attention stays local

Spatial attention lets the S tokens of one frame attend to each other. Under a T split every
frame lives whole on one rank, so each rank computes its frames' spatial attention alone. The
check: each rank's result equals its slice of the one-process answer, and nothing is sent."""),
    ("code", """\
ref = video.spatial_attention(q, k, v)
worst = max(float((video.spatial_attention(*(video.frame_shard(x, r, P) for x in (q, k, v)))
                   - video.frame_shard(ref, r, P)).abs().max()) for r in range(P))
say(f"Spatial attention on each rank's own frames vs the one-process answer: max difference "
    f"**{worst:.1e}**, bytes sent **0**.")"""),
    ("md", """\
## 4. Temporal attention: all-to-all or ring

Temporal attention lets each spatial position attend across all T frames, and those frames
live on different ranks. Two ways out:

* **all-to-all** (DSP, Open-Sora): re-shard from a time split to a **space split**, so each rank
  holds *all* frames of S/P positions; attend locally; re-shard back. Each of q, k, v and the
  output crosses the wire once, and only the (P-1)/P of it that belongs elsewhere.
* **ring**: keep the time split and run ring attention over time, with the S positions folded
  into the batch (`[B*S, H, T_r, D]`). Every rank's K and V visit every other rank.

The figure above shows both layouts. The cost model (`cpcourse.video_costs`) counts the bytes
rank r sends:

* all-to-all: `(3 · T_r · (S − S_r) + (T − T_r) · S_r) · B · H · D · bytes`
* ring: `2 · Σ_{hops} T_j · S · B · H · D · bytes` over the P − 1 blocks it forwards.

### Exercises 06.2 and 06.3: gather the frames; the temporal all-to-all

In `exercises/ex06_video_cp.py` write `gather_frames` (every rank gets the whole video back;
gloo's all-gather needs equal sizes, so pad) and `time_to_space` (one `all_to_all_single` from
the time split to the space split). The next cell starts P processes, runs every method of
`cpcourse.video` and your exercises on them, and counts the bytes each rank sends at the
`torch.distributed` calls themselves (`cpcourse.bytecount.count_bytes`)."""),
    ("code", """\
results = launch("cpcourse.video_lab:measure", P, args=((B, H, T, S, D),),
                 kwargs={"few_frames": (1, 3, 2, 6, 8)}, timeout=120)  # + a video with T < P
summary = summarize(results)
show_table([{**r, "max_err": f"{r['max_err']:.1e}", "seconds": fmt.seconds(r["seconds"])}
            for r in summary])
show_table([{"exercise": name,
             "max error vs float64": f"{max(r['exercises'][name] for r in results):.1e}"}
            for name in results[0]["exercises"]])
vv.bytes_figure(summary, f"P = {P}, video {[B, H, T, S, D]}, float32: bytes sent")"""),
    ("code", """\
rows = {(r["attention"], r["method"]): r for r in summary}
a2a, ring = rows["temporal", "all_to_all"], rows["temporal", "ring"]
say(f"Every method matches the float64 one-process answer (worst "
    f"{max(r['max_err'] for r in summary):.1e}), and the bytes measured equal the prediction "
    f"exactly for every rank: **{all(r['exact'] for r in summary)}**. For temporal attention the "
    f"ring moved **{fmt.ratio(ring['bytes_total'] / a2a['bytes_total'])}** the bytes of the "
    f"all-to-all ({fmt.nbytes(ring['bytes_total'])} vs {fmt.nbytes(a2a['bytes_total'])} "
    f"over all ranks).")"""),
    ("code", """\
cpcourse.check("06.2")"""),
    ("code", """\
cpcourse.check("06.3")"""),
    ("md", """\
### At real sizes

Open-Sora 1.2 at 720p for 16 s has T = 120 latent frames of S = 3,600 tokens, 16 heads of 72
(bf16). Move the slider to change P: the table is the cost model, per attention layer."""),
    ("code", """\
def real_table(P=8):
    rows = video_costs.video_bytes_table(1, 16, 120, 3600, 72, P, elem_bytes=2)
    show_table([{"attention": r["attention"], "method": r["method"],
                 "busiest rank sends": fmt.nbytes(r["max_rank_bytes"]),
                 "all ranks": fmt.nbytes(r["total_bytes"])} for r in rows])

widgets.interact(real_table, P=widgets.IntSlider(value=8, min=2, max=32, description="P"));"""),
    ("md", """\
## 5. Full 3D attention on a video

Cosmos, Wan and HunyuanVideo attend over all T·S tokens at once. A rank's frames are one
contiguous run of the flattened sequence, so the ring (or Ulysses) of notebook 04 applies
as is: flatten `[B, H, T_r, S, D]` to `[B, H, T_r·S, D]`, attend, reshape back. Its bytes are
those of a ring over the whole video: no factored shortcut exists when every token sees every
token.

### Exercise 06.4: the full-3D ring on a video

Write `full_attention_ring` with `cpcourse.ring.ring_attention`. It ran in the launch above;
its error is in the exercises table."""),
    ("code", """\
cpcourse.check("06.4")"""),
    ("md", """\
## 6. Bug hunt: the replicated text tokens

Joint-attention models (HunyuanVideo, CogVideoX, Open-Sora 2.0) append N text tokens to the
video tokens and attend over both. Under CP the text is small, so every rank holds all of it.
`joint_attention_cp_buggy` in your exercise file appends the text to every rank's queries *and*
to every rank's K/V block, then runs the ring. It runs, returns the right shapes, and the
numbers look like attention outputs. The launch above ran it against the one-process answer:"""),
    ("code", """\
show_table([{"rank": r["rank"], **{k: f"{v:.2e}" for k, v in r["joint"].items()}}
            for r in results])
worst_bug = max(r["joint"]["buggy_text_err"] for r in results)
say(f"The buggy version is off by up to **{worst_bug:.2f}** on the text rows at P = {P}: the "
    f"ring shows every K/V block to every rank, so text keys appended on all P ranks enter each "
    f"softmax P times (sglang#33327 measured this as a silently degraded video).")"""),
    ("md", """\
### Exercise 06.5: count the text once

Write `joint_attention_cp`: keep the text queries on every rank (each rank then computes the
text rows in full, identically), but append the text keys and values to **one** rank's block."""),
    ("code", """\
cpcourse.check("06.5")"""),
    ("md", """\
## Worked questions

**Q1.** For the Open-Sora example above at P = 8, how many times more bytes does the temporal
ring move than the temporal all-to-all, per layer? **Q2.** Cosmos-1.0 at 704×1280 has T = 16
latent frames and requires T divisible by the CP degree. What is the largest P its split allows
on 16 GPUs, and what would an uneven split here need instead? **Q3.** Why does the all-to-all
still work when T < P (some ranks hold no frames)?"""),
    ("code", """\
os_rows = {(r["attention"], r["method"]): r
           for r in video_costs.video_bytes_table(1, 16, 120, 3600, 72, 8, elem_bytes=2)}
ratio = (os_rows["temporal", "ring"]["total_bytes"]
         / os_rows["temporal", "all_to_all"]["total_bytes"])
cos = models["cosmos-1.0-diffusion-7b"]
t_cos = cos["latent_grid_THW"][0]
divisors = [p for p in range(1, 17) if t_cos % p == 0]
ok = max(r["few_frames_err"] for r in results)
say(f"**A1.** {fmt.ratio(ratio)}: the ring forwards P − 1 K/V blocks, the all-to-all moves each "
    f"tensor once.\\n\\n"
    f"**A2.** T = {t_cos}, so P must be one of {divisors}: on 16 GPUs, P = {divisors[-1]} "
    f"(one latent frame each); P = 12 would be refused. `cpcourse.video` splits like "
    f"tensor_split instead, {video.shard_sizes(t_cos, 12)} frames at P = 12, at the price of "
    f"uneven work (the busiest rank sets the pace).\\n\\n"
    f"**A3.** The space split does not care how frames were held: T = 2 frames on P = 3 "
    f"ranks ran every method with worst error {ok:.1e} (in section 4's launch). The ranks "
    f"without frames still hold positions after the all-to-all.")"""),
    ("md", """\
Next, notebook 07: a whole (tiny) video DiT built from these pieces, generating the same video
at P = 1, 2 and 4, with its memory per rank measured against the cost model."""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
