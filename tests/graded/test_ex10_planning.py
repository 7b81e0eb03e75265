"""Graded tests of notebook 10: the planner's terms, against `cpcourse.planner.deployment.cost` and
`cpcourse.planner.plan.validity`.

    python -m pytest tests/graded --ex 10.1 --impl solutions

Each case is a real model preset, a real GPU and a layout, the fixed ones of the notebook and
random ones (seeded), with token counts that do not divide evenly over the GPUs. The learner's
seconds must equal the cost model's breakdown to float rounding; HunyuanVideo's rule must agree
with `validity` on every resolution and layout drawn.
"""

import math
import random

import pytest

from cpcourse.planner.deployment import block_params
from cpcourse.planner.deployment import cost as planner_cost
from cpcourse.planner.facts import facts
from cpcourse.planner.hardware import get_gpu, get_link, kernel_efficiency
from cpcourse.planner.plan import validity
from cpcourse.planner.tokens import get_model, model_tokens
from cpcourse.planner.uncertainty import no_latency
from cpcourse.support.layout import Layout, layouts


def cost(*args, **kwargs) -> dict:
    """The cost model as exercises 10.1-10.4 build it: bytes over bandwidth, no collective
    latency (notebook 10's section 6 adds it)."""
    with no_latency():
        return planner_cost(*args, **kwargs)

MODELS = ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b", "wan2.2-t2v-a14b", "hunyuanvideo-13b",
          "cogvideox-5b", "mochi-1", "step-video-t2v-30b", "ltx-video-13b")
GPUS = ("h100", "a100", "h20", "l40s", "rtx4090", "b200")
FIXED = [("hunyuanvideo-13b", "h100", "ring=2,ulysses=4", 8),
         ("hunyuanvideo-13b", "h100", "tp=2,ulysses=4", 8),
         ("wan2.1-t2v-14b", "h800", "cfg=2,ulysses=4", 8),
         ("wan2.1-t2v-1.3b", "rtx4090", "ring=8", 8),
         ("cogvideox-5b", "l40s", "cfg=2,ring=3", 8),
         ("step-video-t2v-30b", "h20", "tp=8", 8),
         ("hunyuanvideo-13b", "h100", "ring=2,ulysses=8", 8)]  # two nodes: the ring over IB


def _cases(seed: int, count: int):
    """(model, gpu, layout, gpus_per_node): the fixed cases, then `count` random ones."""
    rng = random.Random(seed)
    out = [(m, g, Layout.parse(lay), per) for m, g, lay, per in FIXED]
    for _ in range(count):
        world = rng.choice((1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32))
        out.append((rng.choice(MODELS), rng.choice(GPUS), rng.choice(layouts(world)),
                    rng.choice((4, 8))))
    return out


def _rates(gpu: str, kernel: str | None = None):
    """(matmul, attention) FLOP/s on `gpu`: attention at `kernel`, else the GPU's default
    (`default_kernel`: FA2 where flash-attn 2 runs, the generation's kernel on Blackwell)."""
    g = get_gpu(gpu)
    kernel = kernel or g.kernel
    matmul = g.bf16_tflops * 1e12 * float(facts()["calculator_defaults"]["matmul_efficiency"])
    return matmul, g.bf16_tflops * 1e12 * kernel_efficiency(g.id, kernel)[0]


def _block_params(model_id: str) -> float:
    return block_params(model_id)  # as the cost model takes it (derived where counted)


def _close(got, want, what: str, hint: str):
    assert isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15), (
        f"{what}: got {got!r} s, the cost model says {want!r} s ({hint})")


@pytest.mark.ex("10.1")
def test_compute_seconds_equal_the_cost_model(impl):
    mod = impl("ex10_planning")
    for model_id, gpu, lay, per_node in _cases(seed=10, count=60):
        m, tok = get_model(model_id), model_tokens(model_id)
        want = cost(model_id, tok, gpu, lay, per_node)["breakdown"]["per_forward_seconds"]
        matmul, attn = _rates(gpu)
        got = mod.forward_compute_seconds(m, tok, lay, _block_params(model_id), matmul, attn)
        case = f"{model_id} on {gpu} as {lay} ({tok.sequence_length:,} tokens)"
        _close(got["linear"], want["linear"], f"{case}: linear",
               "2 FLOPs per parameter per token of this GPU; TP divides the weights; the text's "
               "K/V projections are not divided by CP")
        _close(got["attention"], want["attention"], f"{case}: attention",
               "each of this GPU's n queries meets all N keys; TP divides the heads; cfg "
               "changes nothing inside one forward")


@pytest.mark.ex("10.1")
def test_compute_seconds_at_other_sizes_and_kernels(impl):
    mod = impl("ex10_planning")
    sizes = [("wan2.1-t2v-14b", 480, 832, 81), ("hunyuanvideo-13b", 544, 960, 61),
             ("cogvideox-5b", 480, 720, 17), ("mochi-1", 480, 848, 31)]
    for (model_id, h, w, f), (gpu, kernel) in zip(sizes, (("h100", "fa3"), ("h20", "fa3"),
                                                          ("a100", "sdpa"), ("h800", "fa2")),
                                                  strict=True):
        m, tok = get_model(model_id), model_tokens(model_id, h, w, f)
        for lay in (Layout(), Layout(ring=3), Layout(cfg=2, ulysses=2, tp=2), Layout(ring=5)):
            want = cost(model_id, tok, gpu, lay, 8, kernel=kernel)["breakdown"][
                "per_forward_seconds"]
            matmul, attn = _rates(gpu, kernel)
            got = mod.forward_compute_seconds(m, tok, lay, _block_params(model_id), matmul, attn)
            for key in ("linear", "attention"):
                _close(got[key], want[key], f"{model_id} {h}x{w}x{f} on {gpu} ({kernel}) as "
                       f"{lay}: {key}", "n = ceil(N / (ring x ulysses)), the busiest GPU's share")


def _links(gpu: str, lay: Layout, per_node: int):
    """The effective GB/s of the links the Ulysses group and the ring cross, as `cost` picks."""
    g = get_gpu(gpu)

    def link(span):
        return get_link(g.intra_link if span <= per_node else g.nic).effective_gbps

    return link(lay.ulysses * lay.tp), link(lay.ring * lay.ulysses * lay.tp)


@pytest.mark.ex("10.2")
def test_comm_seconds_equal_the_cost_model(impl):
    mod = impl("ex10_planning")
    exposed = 0
    for model_id, gpu, lay, per_node in _cases(seed=11, count=80):
        m, tok = get_model(model_id), model_tokens(model_id)
        c = cost(model_id, tok, gpu, lay, per_node)
        want = c["breakdown"]["per_forward_seconds"]
        uly_gbps, ring_gbps = _links(gpu, lay, per_node)
        got = mod.comm_seconds(c["tokens_per_rank"], m.hidden, m.layers, lay, uly_gbps,
                               ring_gbps, _rates(gpu)[1])
        case = f"{model_id} on {gpu} as {lay}, {per_node} GPUs a node"
        _close(got["ulysses"], want["ulysses"], f"{case}: ulysses",
               "4 all-to-alls a layer, each sending (U - 1) / U of n x hidden / T x 2 bytes")
        _close(got["ring_exposed"], want["ring_exposed"], f"{case}: ring_exposed",
               "R - 1 hops a layer, each max(0, K and V of a block over the link - that block's "
               "attention); under USP a block is n U tokens of hidden / (U T) channels")
        exposed += want["ring_exposed"] > 0
    assert exposed, "the cases include rings that cannot hide their hops"


@pytest.mark.ex("10.2")
def test_a_ring_that_cannot_hide(impl):
    mod = impl("ex10_planning")
    m = get_model("wan2.1-t2v-1.3b")
    tok = model_tokens(m.id, 480, 832, 81)
    for lay, gpu, per_node in ((Layout(ring=8), "rtx4090", 8), (Layout(ring=16), "h100", 8),
                               (Layout(ring=16), "a100", 8), (Layout(ring=8), "h100", 1)):
        c = cost(m.id, tok, gpu, lay, per_node)
        uly_gbps, ring_gbps = _links(gpu, lay, per_node)
        got = mod.comm_seconds(c["tokens_per_rank"], m.hidden, m.layers, lay, uly_gbps,
                               ring_gbps, _rates(gpu)[1])
        want = c["breakdown"]["per_forward_seconds"]
        assert want["ring_exposed"] > 0
        for key in ("ulysses", "ring_exposed"):
            _close(got[key], want[key], f"Wan 1.3B 480p on {gpu} as {lay}: {key}",
                   "only the part of a hop longer than its block's attention is exposed")


def _tok(height: int, width: int):
    return model_tokens("hunyuanvideo-13b", height, width, 129)


@pytest.mark.ex("10.3")
def test_hunyuan_readme_resolutions(impl):
    mod = impl("ex10_planning")
    for width, height in ((1280, 720), (720, 1280), (1104, 832), (832, 1104), (960, 960),
                          (960, 544), (544, 960), (848, 480)):
        tok = _tok(height, width)
        for gpus in range(1, 9):
            for lay in layouts(gpus):
                reason = validity("hunyuanvideo-13b", tok, lay)
                got = mod.hunyuan_accepts(height, width, lay)
                assert isinstance(got, bool) and got == (reason is None), (
                    f"{width} wide x {height} high as {lay}: you say "
                    f"{'runs' if got else 'refused'}; validity says "
                    f"{'runs' if reason is None else 'refused: ' + reason}")


@pytest.mark.ex("10.3")
def test_hunyuan_random_resolutions_and_layouts(impl):
    mod = impl("ex10_planning")
    rng = random.Random(3)
    accepted = refused = 0
    for _ in range(400):
        height, width = 16 * rng.randint(1, 128), 16 * rng.randint(1, 128)
        lay = rng.choice(layouts(rng.choice((2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, 48, 64))))
        reason = validity("hunyuanvideo-13b", _tok(height, width), lay)
        got = mod.hunyuan_accepts(height, width, lay)
        assert bool(got) == (reason is None) and isinstance(got, bool), (
            f"{width} wide x {height} high as {lay}: you return {got!r}; validity says "
            f"{'it runs (True)' if reason is None else 'refused (False): ' + reason}")
        accepted += reason is None
        refused += reason is not None
    assert accepted > 20 and refused > 20


@pytest.mark.ex("10.4")
def test_largest_hidden_ring_agrees_with_the_cost_model(impl):
    mod = impl("ex10_planning")
    most = 64
    for model_id in MODELS:
        m = get_model(model_id)
        for gpu in GPUS:
            g = get_gpu(gpu)
            for link, per_node in ((g.intra_link, most), (g.nic, 1)):  # one box, one GPU a node
                tok = model_tokens(model_id)
                hidden = [r for r in range(1, most + 1) if cost(
                    model_id, tok, gpu, Layout(ring=r), per_node)["breakdown"][
                    "per_forward_seconds"]["ring_exposed"] == 0]
                want = max(hidden)
                got = mod.largest_hidden_ring(tok.sequence_length, m.hidden, m.layers,
                                              _rates(gpu)[1], get_link(link).effective_gbps, most)
                assert got == want, (
                    f"{model_id} ({tok.sequence_length:,} tokens) on {gpu}, the ring over {link}: "
                    f"got {got!r}; the cost model hides every hop up to {want} GPUs and exposes "
                    f"some at {want + 1}. When does a block of n tokens take longer to attend "
                    "than to send, and how many tokens does the busiest GPU hold on R GPUs?")
