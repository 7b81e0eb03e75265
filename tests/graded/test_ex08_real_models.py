"""Graded tests of notebook 08: the pieces of CP inside diffusers' Wan, checked in one process.

    python -m pytest tests/graded --ex 08.1 --impl solutions

Each test builds the real `WanTransformer3DModel` (tiny, seeded) and compares the learner's
piece against what the unparallelised model computes: the rotary rows of every shard against
the whole table, the self-attention against diffusers' own processor inside a full forward, and
the joined-text ring, both placements of the text, against one joint softmax and the bytes
it must pass.
"""

import pytest
import torch

from cpcourse.attention import attention_with_lse, reference_attention
from cpcourse.course.testing import assert_close
from cpcourse.models import build, example_inputs
from cpcourse.models.text_ring import STRATEGIES, text_ring
from cpcourse.support.shards import shard_offsets, shard_sizes
from cpcourse.support.tolerance import tolerance

pytest.importorskip("diffusers")


@pytest.mark.ex("08.1")
def test_wan_rope_shard_matches_the_whole_table(impl):
    mod = impl("ex08_real_models")
    model = build("wan")
    for frames, height, width, world in ((5, 8, 8, 2), (7, 8, 12, 3), (4, 6, 4, 4), (9, 4, 8, 4)):
        latents = torch.zeros(1, 4, frames, height, width)
        cos, sin = model.rope(latents)
        pph, ppw, per = height // 2, width // 2, (height // 2) * (width // 2)
        sizes = shard_sizes(frames, world)
        for rank, (f0, nf) in enumerate(zip(shard_offsets(sizes), sizes, strict=True)):
            got = mod.wan_rope_shard(model.rope, f0, nf, pph, ppw)
            for name, g, whole in (("cos", got[0], cos), ("sin", got[1], sin)):
                assert_close(g, whole[:, f0 * per:(f0 + nf) * per], atol=0, rtol=0,
                             dims=("1", "L_r", "1", "D"),
                             name=f"{name} of rank {rank} of {world}, {frames} frames",
                             hint="the frame part starts at global frame f0; rows and columns "
                                  "do not depend on the rank")


def _forward_with(model, inputs, attention):
    """The whole model with every attn1 replaced by `attention(attn, x, rotary_emb)`."""
    class Proc:
        def __call__(self, attn, hidden_states, encoder_hidden_states=None,
                     attention_mask=None, rotary_emb=None):
            return attention(attn, hidden_states, rotary_emb)

    originals = [blk.attn1.processor for blk in model.blocks]
    try:
        for blk in model.blocks:
            blk.attn1.set_processor(Proc())
        with torch.no_grad():
            return model(**inputs, return_dict=False)[0]
    finally:
        for blk, p in zip(model.blocks, originals, strict=True):
            blk.attn1.set_processor(p)


@pytest.mark.ex("08.2")
def test_wan_cp_self_attention_equals_diffusers_processor(impl):
    mod = impl("ex08_real_models")
    model = build("wan", seed=3)
    inputs = example_inputs("wan", frames=3, height=8, width=8, seed=4)
    with torch.no_grad():
        want = model(**inputs, return_dict=False)[0]
    seen = []

    def attend(q, k, v):
        seen.append(tuple(q.shape))
        return attention_with_lse(q, k, v)[0]

    got = _forward_with(model, inputs, lambda a, x, r: mod.wan_cp_self_attention(a, x, r, attend))
    assert seen and seen[0] == (1, 12, 48, 8), (
        f"attend must get q as [B, H, L, D] = (1, 12, 48, 8), got {seen[:1]}")
    assert_close(got, want, atol=1e-6, rtol=1e-6, dims=("B", "C", "F", "H", "W"),
                 name="Wan's output with your attn1",
                 hint="project, norm q and k, split heads, rotate, attend in [B, H, L, D], "
                      "merge heads, to_out")


@pytest.mark.ex("08.3")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_text_counted_once_and_what_travels(impl, strategy, cases_rng):
    mod = impl("ex08_real_models")
    gen = torch.Generator().manual_seed(cases_rng.randrange(2**31))
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    tol = tolerance("ring", "float64")
    for world, length, n_text in ((1, 5, 3), (2, 9, 4), (3, 7, 7), (4, 13, 2), (5, 11, 6)):
        q, k, v = r(1, 2, length, 8), r(1, 2, length, 8), r(1, 2, length, 8)
        text = (r(1, 2, n_text, 8), r(1, 2, n_text, 8), r(1, 2, n_text, 8))
        want = reference_attention(*(torch.cat([x, t], 2)
                                     for x, t in zip((q, k, v), text, strict=True)))[0]
        got = text_ring(q, k, v, text, world, mod.text_ring_step, strategy)
        assert got.keys_met == [length + n_text] * world, (
            f"{strategy}, {world} ranks: each rank's queries met {got.keys_met} keys over the "
            f"ring, the video and text have {length} + {n_text}: each key exactly once")
        for rows, ref, name in [(got.out, want[:, :, :length], "video rows"),
                                *((t, want[:, :, length:], f"rank {i}'s text rows")
                                  for i, t in enumerate(got.text_out))]:
            assert_close(rows, ref, atol=tol, rtol=tol, dims=("B", "H", "L", "D"),
                         name=f"{strategy}, {world} ranks: {name}",
                         hint="every query meets each text key once, whatever the strategy")
        kv_bytes = lambda t: 2 * t.numel() * t.element_size()  # noqa: E731  K and V alike
        video_hops = (world - 1) * kv_bytes(k)
        text_hops = 0 if strategy == "rear" else (world - 1) * kv_bytes(text[1])
        assert sum(got.sent) == video_hops + text_hops, (
            f"{strategy}, {world} ranks: the ranks passed {sum(got.sent):,} bytes in all; the "
            f"video's K and V make {video_hops:,} over the {world - 1} hops"
            + (" and no text byte may travel" if strategy == "rear" else
               f", the text's {text_hops:,} when one block carries it every hop"))


def _padded_gather(tokens, sizes):
    """What an all-gather returns when each rank pads its shard of `tokens` to the longest."""
    most = max(sizes)
    shards = tokens.split(sizes, dim=1)
    return torch.cat([torch.cat([s, s.new_zeros(s.shape[0], most - s.shape[1], *s.shape[2:])],
                                dim=1) for s in shards], dim=1)


@pytest.mark.ex("08.4")
def test_unpad_gathered_gives_the_whole_video(impl):
    mod = impl("ex08_real_models")
    gen = torch.Generator().manual_seed(0)
    for frames, world, per in ((4, 2, 16), (5, 2, 16), (7, 3, 16), (5, 3, 4), (9, 4, 6),
                               (6, 4, 1), (3, 3, 8), (11, 5, 3)):
        sizes = [n * per for n in shard_sizes(frames, world)]
        tokens = torch.randn(2, sum(sizes), 5, generator=gen)
        got = mod.unpad_gathered(_padded_gather(tokens, sizes), sizes)
        assert_close(got, tokens, atol=0, rtol=0, dims=("B", "L", "C"),
                     coords={"L": lambda i, per=per: {"frame": i // per}},
                     name=f"{frames} frames of {per} tokens on {world} ranks, sizes {sizes}",
                     hint="each rank's block in the gathered buffer has max(sizes) tokens: its "
                          "padding sits at the end of that block, not at the end of the buffer")
