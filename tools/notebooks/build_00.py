"""python tools/notebooks/build_00.py: write notebooks/00_token_explosion.ipynb (no outputs).

The notebook is authored here as a list of cells so that it stays reviewable as text and is
always committed without outputs or execution counts. Every number the notebook states is
printed by a code cell from `cpcourse`; the Markdown cells carry only ideas, never results.
`--check` exits 1 when the committed notebook differs from what this script would write.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nbbuild  # noqa: E402

OUT = nbbuild.notebook_path("00_token_explosion.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# 00 · The token explosion

A video diffusion transformer (DiT) never sees pixels. A VAE first squeezes the clip into a small
latent grid, the DiT cuts that grid into patches, and each patch becomes one token of a single long
sequence. Self-attention then scores every token against every other token. An image makes a few
thousand tokens; a few seconds of video make tens or hundreds of thousands, and attention's cost
grows with the *square* of that count. This is the wall that **context parallelism (CP)**, splitting
the sequence itself across GPUs, is built to get over.

The course grew from a short blog article on CP for video models. Its story is sound; several of its
figures are not. This notebook recomputes each of them with `cpcourse`, keeps what holds and fixes
what does not. **No number in this notebook is typed into the prose: each is printed by a code
cell**, so you can change an assumption and rerun.

By the end you can count the tokens of any clip for any real model (exercise 00.1), say what one
GPU can hold, size what CP saves, and tell whether a ring of GPUs hides its communication.
Runs on a laptop CPU in seconds: *Run → Run All Cells*."""),
    ("code", """\
%matplotlib inline
import cpcourse
from cpcourse.costs import attention_flops, comm, memory, shard_sizes
from cpcourse.hardware import get_gpu, get_link
from cpcourse.plan import plan
from cpcourse.tokens import FrameRule, frames_for_clip, get_model, model_tokens, video_tokens
from cpcourse.viz import fmt, seed
from cpcourse.viz import tokens as vt
from cpcourse.viz.fmt import say, show_table

# The article's figures, each recomputed by cpcourse (section 12 shows them all).
audit = {row["claim"]: row for row in seed.audit()}
h100, h200 = get_gpu("h100"), get_gpu("h200")
say(f"GPU memory used below: {h100.name} **{fmt.gb(h100.hbm_bytes)}**, {h200.name} "
    f"**{fmt.gb(h200.hbm_bytes)}** (from `cpcourse.hardware`, sources kept there).")"""),
    ("md", """\
## 1. One frame: pixels → latent cells → tokens

Two stages shrink a frame before the transformer sees it:

1. the **VAE** encodes each *s × s* block of pixels as one latent cell (s = 8 for most video
   VAEs; the newest go to 16 or 32), and
2. the DiT's **patchify** layer groups *p_h × p_w* latent cells into one token (almost always
   2 × 2).

One token therefore stands for *(s·p_h) × (s·p_w)* pixels. The article gives a token count for a
720p frame cut into 2 × 2 patches; let us check it."""),
    ("code", """\
frame = video_tokens(720, 1280, frames=1, vae_spatial=8, patch=(1, 2, 2))
raw = video_tokens(720, 1280, frames=1, vae_spatial=1, patch=(1, 2, 2))
wan5b = model_tokens("wan2.2-ti2v-5b", frames=1)  # a 16x VAE: 32 px per token

grid = lambda t, p=2: f"{t.latent_height // p} x {t.latent_width // p}"  # 2x2 patches
show_table([
    {"recipe": "8x VAE + 2x2 patch (Wan2.1, HunyuanVideo, Cosmos, CogVideoX)",
     "px per token": frame.pixels_per_token, "token grid": grid(frame),
     "tokens per frame": fmt.count(frame.tokens_per_frame)},
    {"recipe": "2x2 patch straight on pixels (no VAE)", "px per token": raw.pixels_per_token,
     "token grid": grid(raw), "tokens per frame": fmt.count(raw.tokens_per_frame)},
    {"recipe": f"16x VAE + 2x2 patch (Wan2.2 TI2V-5B at {wan5b.height}x{wan5b.width})",
     "px per token": wan5b.pixels_per_token, "token grid": grid(wan5b),
     "tokens per frame": fmt.count(wan5b.tokens_per_frame)},
])
row = audit["tokens per 720p frame (8x VAE, 2x2 patch)"]
say(f"**The article:** {row['article']} tokens per 720p frame. **Recomputed:** "
    f"{row['cpcourse']}, so the article is {row['verdict']}. Its figure would need "
    f"32-pixel tokens, and even then 720 / 32 = {720 / 32} is not a whole number of token "
    f"rows: a 32-pixel model runs at {wan5b.height} rows and gets "
    f"{fmt.count(wan5b.tokens_per_frame)}.")"""),
    ("md", """\
## 2. Time: frames become latent frames

Video VAEs compress time as well. The ones in today's models are **causal**: the first frame is
encoded on its own (so a clip can start from a still image), then each following group of *k*
frames becomes one latent frame. Hence *T = (F − 1) // k + 1* latent frames, and clip lengths
of the form *k·n + 1*: every causal model in section 6 defaults to one frame more than a
multiple of its *k*. *k* is 4 for Wan, HunyuanVideo and CogVideoX, 6 for Mochi and 8 for
Cosmos-1.0 and LTX-Video.

The article's worked example, 720p for 5 s at 24 fps, gives every raw frame its own slice of
tokens, as if the VAE left time alone. Here is that recipe next to the two common causal VAEs:"""),
    ("code", """\
rows = []
for vae in vt.seed_vaes():
    f = frames_for_clip(24, 5, vae.rule)  # snapped to a frame count the VAE accepts
    t = vae.tokens(720, 1280, f)
    rows.append({"VAE": vae.label, "frames": f, "latent-frame rule": t.frame_rule,
                 "latent frames": t.latent_frames, "tokens": fmt.count(t.video_tokens)})
show_table(rows)

say("The article's token counts, recomputed:")
show_table([audit[k] for k in ("tokens of 720p, 5 s, 24 fps", "tokens of 16 frames",
                               "tokens of 48 frames")],
           ["claim", "article", "verdict", "fix"])"""),
    ("code", """\
# A curiosity: one released model does see the article's token count by default.
os12 = model_tokens("open-sora-1.2-stdit3")
m = get_model("open-sora-1.2-stdit3")
say(f"{m.name} at its default {os12.height}x{os12.width}, {os12.frames} frames: "
    f"{os12.latent_frames} latent frames x {fmt.count(os12.tokens_per_frame)} = "
    f"**{fmt.count(os12.video_tokens)}** positions. But its attention is *factored*: spatial "
    f"attention within one frame ({fmt.count(os12.tokens_per_frame)} tokens) and temporal "
    f"attention along one position ({os12.latent_frames} tokens), so its largest score matrix "
    f"per head is {fmt.count(os12.tokens_per_frame)}² = "
    f"{fmt.nbytes(os12.tokens_per_frame ** 2 * 2)}, not {fmt.count(os12.video_tokens)}².")"""),
    ("md", """\
## 3. Counting tokens

**Exercise 00.1.** Open `exercises/ex00_tokens.py` and write `count_video_tokens`: latent frames
from the VAE's time rule, then patches along time (rounded up), height and width. The docstring
printed below is the spec. Until you write it, the cells below say *not implemented yet* and
use the reference answer, so the notebook still runs; save your file and rerun the cells to use
yours."""),
    ("code", """\
count_video_tokens = cpcourse.exercise("00.1")
print(count_video_tokens.__doc__)"""),
    ("code", """\
mine = count_video_tokens(720, 1280, 121, vae_temporal=4, vae_spatial=8, patch=(1, 2, 2))
ref = video_tokens(720, 1280, 121, vae_temporal=4, vae_spatial=8, patch=(1, 2, 2)).video_tokens
say(f"`count_video_tokens(720, 1280, 121, vae_temporal=4)` = **{fmt.count(mine)}**; "
    f"`cpcourse.tokens.video_tokens` says **{fmt.count(ref)}**: "
    + ("they agree." if mine == ref else "they differ; read the spec again."))"""),
    ("code", """\
cpcourse.check("00.1")  # runs the graded tests of 00.1 on exercises/ex00_tokens.py"""),
    ("md", """\
## 4. Attention: the square

Each attention head scores every query against every key: an *N × N* matrix per head, per layer,
per batch element. The table shows that matrix, in fp16, for the article's sequence and for the
same clip through a real 4× causal VAE."""),
    ("code", """\
seed_n = video_tokens(720, 1280, 120).video_tokens                    # the article's recipe
real_n = video_tokens(720, 1280, 121, vae_temporal=4).video_tokens     # a 4x causal VAE
rows = []
for label, n in (("the article's recipe", seed_n), ("4x causal VAE", real_n)):
    mm = memory(n, hidden=4096, heads=32, dtype="fp16")
    rows.append({"sequence": label, "tokens": fmt.count(n),
                 "scores per head": fmt.sci(mm["attention_matrix_entries_per_head"]),
                 "bytes per head": fmt.nbytes(mm["attention_matrix_bytes_per_head"]),
                 "H100s to hold one head":
                     f"{mm['attention_matrix_bytes_per_head'] / h100.hbm_bytes:.1f}"})
show_table(rows)
r = audit["one head's attention matrix"]
say(f"**The article:** {r['article']} per head. **Recomputed:** {r['cpcourse']}: {r['verdict']}, "
    f"{r['fix']}.")"""),
    ("md", """\
Nobody stores that matrix. Fused kernels such as FlashAttention compute it tile by tile and keep
only a running maximum and sum per query (the *online softmax* of notebook 02), so attention's
**memory** grows linearly with *N*. Its **FLOPs** do not: they stay quadratic, and that is what
ends up setting the time. The plot shows both growths as the clip gets longer; the dotted lines are
the memory of one GPU."""),
    ("code", """\
vt.growth_figure(720, 1280, fps=24, max_seconds=20, mark_seconds=5)"""),
    ("md", """\
## 5. What one layer really holds

With fused attention, what a layer keeps in memory is its activations: the hidden state, the
queries, keys and values, the attention output and the MLP's wide intermediate. The article sizes
Q, K and V alone for its sequence (hidden width 4096, 32 heads)."""),
    ("code", """\
mm = memory(seed_n, hidden=4096, heads=32, dtype="fp16")
cosmos = get_model(seed.SEED_MODEL)  # a real DiT with exactly the article's widths
weights = memory(seed_n, cosmos.hidden, cosmos.heads, params_b=cosmos.params_b)["weights_bytes"]
show_table([{"one layer, batch 1, fp16": k, "bytes": fmt.nbytes(v)} for k, v in [
    ("Q, K and V (3 x N x hidden)", mm["qkv_bytes"]),
    ("hidden state (N x hidden)", mm["hidden_state_bytes"]),
    (f"MLP intermediate (N x {mm['ffn']})", mm["mlp_intermediate_bytes"]),
    ("all activations of the layer", mm["activation_bytes_per_layer"]),
    (f"for scale: all weights of {cosmos.name}", weights),
]])
r = audit["Q, K and V"]
say(f"**The article:** {r['article']}. **Recomputed:** {r['fix']}: the article is {r['verdict']}. "
    f"Batching the two CFG passes doubles it. Note the last row: at this length one layer's "
    f"activations ({fmt.nbytes(mm['activation_bytes_per_layer'])}) outweigh the whole model "
    f"({fmt.nbytes(weights)}). In video DiTs the sequence, not the model, is the big thing.")"""),
    ("md", """\
## 6. Real models at their default settings

The same arithmetic for every model in `cpcourse`'s presets, each at the resolution and length its
own code uses by default (read from each repository; `cpcourse tokens --model ID` prints one).
*Sequence* adds the text tokens for models that attend to text jointly with video; bytes are bf16,
batch 1, one layer. Hover the last column for the full description of the official multi-GPU
recipe."""),
    ("code", """\
rows = vt.model_rows()
show_table(rows, ["model", "default video", "latent grid", "video tokens", "sequence",
                  "attention / head", "Q/K/V / layer", "forwards / step", "attention",
                  "official multi-GPU"], titles={"official multi-GPU": "parallel_full"})
full = [r for r in rows if r["attention"] == "full 3D"]
big, small = max(full, key=lambda r: r["_tokens"]), min(full, key=lambda r: r["_tokens"])
say(f"Full-3D-attention defaults range from {fmt.count(small['_tokens'])} tokens "
    f"({small['model']}) to **{fmt.count(big['_tokens'])}** ({big['model']}), whose one "
    f"head's matrix would be {big['attention / head']}. No released full-attention model "
    f"runs the article's {fmt.count(seed_n)} by default. *Forwards / step* is 2 when the "
    f"sampler runs real classifier-free guidance (a conditional and an unconditional pass), "
    f"1 when the model is guidance-distilled.")"""),
    ("md", """\
## 7. Splitting the sequence: context parallelism

CP gives each of *P* GPUs a contiguous run of the sequence. Tokens are ordered (time, height,
width), so a run is a block of whole frames. Each GPU projects its own tokens to Q, K and V; since
its queries must still meet *every* key, the K/V blocks then travel between GPUs (the ring of
notebooks 03 and 04). A length that does not divide evenly is split like `torch.tensor_split`."""),
    ("code", """\
r = audit["tokens per rank at CP=8"]
say(f"The article's sequence on 8 GPUs: {shard_sizes(seed_n, 8)} tokens per rank, "
    f"i.e. {r['cpcourse']} each ({r['verdict']}). An uneven case, {fmt.count(real_n + 3)} "
    f"tokens on 8 GPUs: {shard_sizes(real_n + 3, 8)}.")"""),
    ("md", """\
What does that save per GPU? Below, HunyuanVideo at its default (the longest sequence in the table)
on 1 to 32 GPUs. Weights are replicated on every CP rank, so they are a floor no CP degree goes
under; activations and stored scores divide by *P*."""),
    ("code", """\
hy = get_model("hunyuanvideo-13b")
hy_n = model_tokens(hy.id).sequence_length
display(vt.cp_memory_figure(hy.id, hy_n))
need = {g.id: next((p for p in vt.CP_DEGREES
                    if vt.gpu_memory(hy, hy_n, p)["materialised"] <= g.hbm_bytes), None)
        for g in (h100, h200)}
one_gpu = vt.gpu_memory(hy, hy_n, 1)
step_s = (attention_flops(hy_n, hy_n, hy.head_dim, hy.heads) * hy.layers * hy.cfg_forwards
          / h100.attention_flops())
say(f"Storing the scores, one layer needs CP={need[h100.id]} to fit an H100 and "
    f"CP={need[h200.id]} for an H200. With fused attention it fits on **one** GPU "
    f"({fmt.nbytes(one_gpu['fused'])}, mostly weights). So for today's default clips CP is "
    f"mainly about **time**: attention alone costs {fmt.seconds(step_s)} per sampling step on one "
    f"H100 at {h100.attention_efficiency:.0%} of peak, for each of dozens of steps; "
    f"CP=8 divides that by 8, if communication hides.")"""),
    ("md", """\
## 8. The ring's traffic: per what?

In a ring of *P* GPUs each one, at every step, sends its current K/V block to its neighbour and
receives the next one: *P − 1* hops per attention layer. The article sizes these hops for its
sequence at CP = 8 (head dim 128, 32 heads, fp16) and adds them up over the ring."""),
    ("code", """\
c = comm(seed_n, 8, heads=32, head_dim=128, dtype="fp16", bandwidth_gbps=450,
         layers=cosmos.layers, cfg_forwards=cosmos.cfg_forwards)
show_table([{"K/V sent per GPU": k, "bytes": fmt.nbytes(v)} for k, v in [
    ("one head, one hop", c["kv_bytes_per_hop_per_head"]),
    ("all heads, one hop", c["kv_bytes_per_hop"]),
    (f"one layer ({c['ring_hops']} hops)", c["kv_bytes_total"]),
    (f"one sampling step ({cosmos.layers} layers x {cosmos.cfg_forwards} CFG forwards)",
     c["kv_bytes_per_forward"]),
]])
r = audit[f"K/V over {c['ring_hops']} hops"]
say(f"The article's {r['article']} is {r['verdict']}, but it is **{r['fix']}**. Each GPU also "
    f"receives as much as it sends.")"""),
    ("md", """\
## 9. Does the ring hide its traffic?

Ring attention overlaps: while a GPU scores its queries against the K/V block it holds, the next
block is already on the wire. So the question is whether **one hop** takes less time than **one
step** of compute. The article compares all hops together against one step's compute, which mixes
a total with a per-step figure."""),
    ("code", """\
nv = get_link("nvlink4")
c_eff = comm(seed_n, 8, heads=32, head_dim=128, dtype="fp16", link=nv.id, gpu=h100.id)
show_table([{"per ring step": k, "time": fmt.seconds(v)} for k, v in [
    (f"one hop at {c['link_GBps']:g} GB/s (line rate)", c["comm_seconds_per_hop"]),
    (f"one hop at {nv.effective_gbps:g} GB/s (what NCCL gets over {nv.name})",
     c_eff["comm_seconds_per_hop"]),
    (f"compute: {fmt.count(c['tokens_per_rank'])} queries x as many keys at "
     f"{c['attention_efficiency']:.0%} of {h100.bf16_tflops:g} TFLOP/s",
     c["compute_seconds_per_step"]),
]])
r_t, r_c = audit[f"time of {c['ring_hops']} hops at 450 GB/s"], audit["compute of one ring step"]
say(f"The article's {r_t['article']} for all hops is {r_t['verdict']}, and its step compute of "
    f"{r_c['article']} is {r_c['verdict']}. Per step, compute outlasts the hop "
    f"{fmt.ratio(c['compute_to_comm_ratio'])} over: the ring hides with a wide margin.")"""),
    ("md", """\
Per step, compute is about *4·L²·d·H* FLOPs for *L* tokens per GPU while the hop moves *2·L·d·H*
elements, so their ratio grows with *L* alone, not with heads or head size. The ring therefore
hides once each GPU holds more than a threshold number of tokens, set by the GPU's rate and the
link's bandwidth. The table checks the article's workload and Cosmos-1.0-7B's real default on three
links (effective bandwidths)."""),
    ("code", """\
cos_n = model_tokens(cosmos.id).sequence_length
rows = []
for label, n in (("the article's sequence", seed_n), (f"{cosmos.name} default", cos_n)):
    for link in ("nvlink4", "pcie5", "ib-ndr"):
        cc = comm(n, 8, cosmos.heads, cosmos.head_dim, link=link, gpu=h100.id)
        rows.append({"workload, CP=8": label, "link": get_link(link).name,
                     "tokens per GPU": fmt.count(cc["tokens_per_rank"]),
                     "hop": fmt.seconds(cc["comm_seconds_per_hop"]),
                     "step compute": fmt.seconds(cc["compute_seconds_per_step"]),
                     "hides?": "yes" if cc["hidden"] else "no",
                     "hides from (tokens per GPU)": fmt.count(cc["min_tokens_per_rank_to_hide"])})
show_table(rows)"""),
    ("md", """\
## 10. Across nodes: tensor parallelism or CFG-parallel?

The article suggests going to two nodes by adding tensor parallelism (TP = 2) across them. TP splits
every matmul of a block and then sums the partial results with an all-reduce, twice per block,
and the next matmul cannot start until that sum arrives: nothing hides it. Inside a node that sum
rides NVLink; across nodes, InfiniBand, roughly an order of magnitude slower per GPU. For a model
whose weights fit on one GPU there is a better use of a second node: **CFG-parallel**, the
conditional pass on one node and the unconditional pass on the other, exchanging one latent-sized
prediction per sampling step."""),
    ("code", """\
tp = seed.tp_across_nodes(cosmos.id, cp=8, tp=2, gpu="h100")
waits = {where: f"{fmt.seconds(tp['allreduce_seconds_per_block_' + tp[where]])} "
                f"({tp['exposed_fraction_' + tp[where]]:.0%} of compute)"
         for where in ("intra", "inter")}
show_table([{"per block, CP=8 x TP=2": k, "value": v} for k, v in [
    ("compute per GPU", fmt.seconds(tp["block_compute_seconds"])),
    ("TP all-reduce traffic per GPU", fmt.nbytes(tp["allreduce_bytes_per_block"])),
    (f"all-reduce time over {tp['intra']} (TP inside a node)", waits["intra"]),
    (f"all-reduce time over {tp['inter']} (TP across nodes)", waits["inter"]),
    ("CFG-parallel instead: exchange per sampling step",
     fmt.nbytes(tp["cfg_exchange_bytes_per_step"])),
]])
p = plan(cosmos.id, gpus=16, gpu="h100", nodes=2)
say(f"`cpcourse plan` for {cosmos.name} on 16 H100s in 2 nodes picks CFG-parallel "
    f"{p['cfg_parallel']} x CP {p['cp']} x TP {p['tp']}:\\n\\n"
    + "\\n".join(f"- {line}" for line in p["reasoning"]))"""),
    ("md", """\
## 11. Explore

Pick a model (or your own VAE and patch), a resolution and a clip length, a CP degree, a GPU and a
link. Frame counts snap to what the model's VAE accepts, sizes to whole tokens. The left plot
compares this recipe with the article's; the right one shows bytes per GPU against every GPU's
memory, the chosen GPU in red."""),
    ("code", """\
from cpcourse.viz.dashboard import token_dashboard

dashboard = token_dashboard(model="wan2.1-t2v-14b", cp=8, gpu="h100", link="nvlink4")
dashboard"""),
    ("md", """\
**Worked question.** With fused attention and CP = 8 on H100s, how long a 720p clip at 24 fps can
HunyuanVideo take before one layer no longer fits in one GPU? Guess with the dashboard, then run
the cell."""),
    ("code", """\
def fits(seconds, cp=8, gpu=h100):
    f = frames_for_clip(24, seconds, hy.rule)
    n = model_tokens(hy.id, 720, 1280, f).sequence_length
    return vt.gpu_memory(hy, n, cp)["fused"] <= gpu.hbm_bytes, f, n

s = 1.0
while fits(s + 1)[0] and s < 3600:
    s += 1
ok, f, n = fits(s)
step = attention_flops(n, n, hy.head_dim, hy.heads) * hy.layers / 8 / h100.attention_flops()
say(f"Up to about **{s:g} s** ({f} frames, {fmt.count(n)} tokens, "
    f"{fmt.count(max(shard_sizes(n, 8)))} per GPU). By then one sampling step's attention "
    f"would take {fmt.seconds(step)} per GPU: long before memory runs out, time does.")"""),
    ("md", """\
## 12. The article, audited

Every figure the article states, next to `cpcourse`'s (under the article's own assumptions), with
what it should say."""),
    ("code", """\
show_table(list(audit.values()), ["claim", "article", "cpcourse", "verdict", "fix"])"""),
    ("md", """\
**What to keep.** Video turns attention into a sequence problem; splitting the sequence (CP) is the
first tool, and on NVLink a ring hides its traffic easily once each GPU holds a few thousand
tokens. **What to fix.** Count 16 pixels per token, compress time as the VAE does, state traffic
per layer and per forward, compare per-step compute with per-step communication, and keep TP
inside a node.

Next, notebook 01: attention on one device, naive against memory-efficient, measured."""),
]


def main(argv: list[str]) -> int:
    return nbbuild.run(CELLS, OUT, argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
