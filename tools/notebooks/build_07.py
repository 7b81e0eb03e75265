"""python tools/notebooks/build_07.py: write notebooks/07_tiny_dit_under_cp.ipynb (no outputs).

Authored as a list of cells so that it stays reviewable as text; every number the notebook
states is printed by a code cell from `cpcourse`. `--check` exits 1 when the committed notebook
differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("07_tiny_dit_under_cp.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 07 · A tiny video DiT under CP

Notebook 06 built the pieces: a video split along time, spatial attention that stays local,
temporal attention by all-to-all or ring, full 3D attention by the ring. Here they run inside a
whole (tiny) video diffusion transformer that samples a video, on 1, 2 and 4 processes:

1. the model, and the two things that must **not** depend on P: positions (exercise 07.1) and
   the starting noise (07.2);
2. the same sample at P = 1, 2, 4, shown as frames, with the largest difference measured;
3. peak tensor memory per rank against P, measured, beside a cost model that predicts it;
4. time per denoising step against P, on this laptop, and why it behaves as it does.

The weights are random (seeded): the model shows that CP is exact, not that it draws cats.
The same run from a shell: `cpcourse generate --nproc 2 --seed 0 --save /tmp/sample.pt`."""),
    ("code", """\
%matplotlib inline
import torch

import cpcourse
from cpcourse.course import exercise
from cpcourse.dit import DiTConfig, build_model
from cpcourse.dit_costs import peak_phase, phase_elements
from cpcourse.generate import initial_noise, run_generate
from cpcourse.rope import rope_3d
from cpcourse.viz import fmt
from cpcourse.viz import video as vv
from cpcourse.viz.fmt import say, show_table"""),
    ("md", """\
## 1. The model

`cpcourse.dit.TinyVideoDiT` is a DiT in miniature: the latent video `[B, C, T, Hl, Wl]` is cut
into 2×2 patches (tokens `[B, T, S, C·4]`), a timestep and class embedding modulates every
block (adaLN), and each block runs spatial attention, temporal attention and an MLP (the
"factored" design of Open-Sora 1.x and Latte; `attention="full"` swaps in one 3D attention, the
design of Cosmos and Wan). The sampler takes a few Euler steps of a rectified flow with
classifier-free guidance (conditional and unconditional passes as one batch of 2B).

Under CP a rank holds frames `[t0, t0 + T_r)` of every tensor and nothing else: patches,
modulation, the MLP and spatial attention are per frame; only the temporal attention talks."""),
    ("code", """\
SHAPE = {"frames": 8, "height": 16, "width": 16}
cfg = DiTConfig()
n_params = sum(p.numel() for p in build_model(cfg).parameters())
tokens = SHAPE["frames"] * (SHAPE["height"] // cfg.patch) * (SHAPE["width"] // cfg.patch)
say(f"Model: hidden {cfg.hidden}, {cfg.heads} heads of {cfg.head_dim}, {cfg.depth} blocks, "
    f"**{n_params:,} parameters**. Video: {SHAPE['frames']} latent frames of "
    f"{SHAPE['height']}×{SHAPE['width']} = **{tokens} tokens**.")"""),
    ("md", """\
## 2. What must not depend on P

### Exercise 07.1: positions under CP

Rotary embeddings rotate q and k by each token's (frame, row, column). A rank that numbers its
frames from 0 gives the model P copies of the first frames: no error is raised, the sample is
just different. Write `rope_on_shard` in `exercises/ex07_dit_cp.py` so that a shard is rotated
by its **global** frame index."""),
    ("code", """\
rope_on_shard = exercise("07.1")
x = torch.randn(1, 2, 8, 64, 16, dtype=torch.float64)
whole = rope_3d(x, 8, 8)                          # one process: frames 0..7
mine = torch.tensor_split(x, 2, dim=2)[1]         # rank 1 of 2 holds frames 4..7
good = rope_on_shard(mine, 8, 8, 8, 1, 2)
bad = rope_3d(mine, 8, 8)                         # the bug: local frame numbers 0..3
want = torch.tensor_split(whole, 2, dim=2)[1]
say(f"Rank 1 vs one process: global offset max difference **{(good - want).abs().max():.1e}**; "
    f"local frame numbers **{(bad - want).abs().max():.2f}**.")"""),
    ("code", """\
cpcourse.check("07.1")"""),
    ("md", """\
### Exercise 07.2: the same noise at any P

Each rank needs its frames of the starting noise. Seeding rank r with `seed + r`, or drawing
only `T_r` frames, gives a different video for every P. Write `local_noise`: draw the whole
video's noise from one generator and keep your frames (at this size it costs nothing; a real
model can draw it on one rank and scatter it)."""),
    ("code", """\
local_noise = exercise("07.2")
shape = (1, 4, 8, 16, 16)
ok = all(torch.equal(torch.cat([local_noise(shape, 0, r, p) for r in range(p)], dim=2),
                     initial_noise(shape, 0)) for p in (1, 2, 4))
say(f"Noise gathered from 1, 2 and 4 ranks equals the one-process noise: **{ok}**.")"""),
    ("code", """\
cpcourse.check("07.2")"""),
    ("md", """\
## 3. The same sample at P = 1, 2, 4

`run_generate` starts P processes; each builds the same model from a seed, takes its frames of
the noise, samples, and measures its peak tensor memory and its time per step. The latents
come back to this notebook. The temporal attention uses the all-to-all of notebook 06."""),
    ("code", """\
runs = {p: run_generate(p, seed=0, **SHAPE, timeout=120) for p in (1, 2, 4)}
ref = runs[1]["latents"]
rows = []
for p, run in runs.items():
    rep = run["report"]
    rows.append({"P": p, "frames per rank": rep["frames_per_rank"],
                 "max |diff| vs P=1": f"{(run['latents'] - ref).abs().max():.1e}",
                 "peak per rank (measured)": fmt.nbytes(max(rep["peak_bytes_per_rank"])),
                 "predicted": fmt.nbytes(max(rep["predicted_peak_bytes_per_rank"])),
                 "worst model error": f"{rep['peak_vs_predicted_worst_rel_err']:.1%}",
                 "time per step": fmt.seconds(rep["seconds_per_step"])})
show_table(rows)
vv.frames_figure({p: run["latents"] for p, run in runs.items()})"""),
    ("code", """\
worst = max(float((run["latents"] - ref).abs().max()) for run in runs.values())
say(f"The three samples agree to **{worst:.1e}** (float32; see question 3 below).")"""),
    ("md", """\
## 4. Memory per rank

`cpcourse.memory.peak_memory` counts the bytes of tensor storage alive at once during sampling
(the weights existed before and are not counted: CP replicates weights and divides
activations). `cpcourse.dit_costs` predicts that peak with a ledger read off the code: for each
phase of a step, the tensors alive at that moment, per token this rank holds."""),
    ("code", """\
vv.memory_figure({p: run["report"] for p, run in runs.items()})"""),
    ("code", """\
shape5 = [1, cfg.in_channels, SHAPE["frames"], SHAPE["height"], SHAPE["width"]]
show_table([{"P": p, **{name: fmt.nbytes(4 * n) for name, n in
                        phase_elements(cfg, shape5, p, 0).items()},
             "peak phase": peak_phase(cfg, shape5, p, 0)} for p in (1, 2, 4)])
m = {p: max(run["report"]["peak_bytes_per_rank"]) for p, run in runs.items()}
ring = {p: 4 * max(phase_elements(cfg, shape5, p, 0, temporal_method="ring").values())
        for p in (1, 2, 4)}
say(f"Measured peak per rank falls **{fmt.ratio(m[1] / m[2])}** from P = 1 to 2 and "
    f"**{fmt.ratio(m[1] / m[4])}** from 1 to 4: every term of the ledger is per local token. "
    f"The all-to-all's buffers set the peak (the *temporal* phase). With the temporal **ring** "
    f"instead, the model predicts {fmt.nbytes(ring[1])} → {fmt.nbytes(ring[2])} → "
    f"{fmt.nbytes(ring[4])}: at P = 1 there is no ring, from P = 2 its two K/V receive buffers "
    f"and the merge's temporaries come in, so memory does not halve at the first step.")"""),
    ("md", """\
## 5. Time per step

On this laptop the P processes share two CPU cores, and this model is tiny, so each step is
dominated by fixed costs (process-group messages, Python) rather than attention. The table
above shows time per step rising or flat with P. On GPUs with real sizes the attention work per
rank falls as 1/P (factored) or stays T·S × T_r·S (full 3D), and notebook 05's question (is
the communication hidden?) decides what you see.

## Worked questions

**Q1.** By how much does the peak memory per rank fall from P = 1 to P = 4, measured, and how
close is the ledger? **Q2.** Which phase of a denoising step sets the peak, and what would you
change to lower it? **Q3.** Is the P = 4 sample bit-identical to P = 1? Would it be with the
temporal ring? (The next cell runs the ring at P = 2 to find out.)"""),
    ("code", """\
worst_model = max(run["report"]["peak_vs_predicted_worst_rel_err"] for run in runs.values())
ring_run = run_generate(2, seed=0, **SHAPE, temporal_method="ring", timeout=120)
ring_diff = float((ring_run["latents"] - ref).abs().max())
phases = phase_elements(cfg, shape5, 4, 0)
say(f"**A1.** {fmt.ratio(m[1] / m[4])} (from {fmt.nbytes(m[1])} to {fmt.nbytes(m[4])}); the "
    f"ledger is within {worst_model:.1%} on every rank.\\n\\n"
    f"**A2.** The *{peak_phase(cfg, shape5, 4, 0)}* phase ({fmt.nbytes(4 * max(phases.values()))}"
    f" at P = 4, vs {fmt.nbytes(4 * phases['mlp'])} for the MLP): the all-to-all's send and "
    f"receive buffers and the re-sharded q, k, v are alive together. Sending q, k and v in three "
    f"all-to-alls instead of one stacked one, or freeing each buffer as soon as it is copied, "
    f"lowers it.\\n\\n"
    f"**A3.** With the all-to-all the largest difference is **{worst:.1e}**: each position's "
    f"temporal attention still sees all its frames in one kernel call, and every other op "
    f"works per token, so nothing is summed in another order. With the ring at P = 2 it is "
    f"**{ring_diff:.1e}**: partial attentions over key blocks are merged through their "
    f"log-sum-exp, which rounds differently (still far below the 1e-5 the tests allow).")"""),
    ("md", """\
Next, notebook 08: CP combined with tensor parallelism and CFG-parallel, planning real models,
and temporal sliding windows."""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
