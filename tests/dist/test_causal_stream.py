"""The shipped chunk-causal shapes model streamed under CP: one clip for every P and cache design.

    python -m pytest tests/dist/test_causal_stream.py -q

One launch per P (1, 2, 4) streams the same prompt and seed with every KV-cache design (the
model's 4 heads split over 2 and 4 ranks, so Ulysses fits each; at P = 4 a rank holds half a
frame of each chunk); the ranks return their
pieces of every chunk and what they sent, and the clips are compared here with the one streamed
in this process. The tracker then checks that the shipped model follows its prompts.
"""

import pytest

from cpcourse.causal import DESIGNS
from cpcourse.launch import launch
from cpcourse.support.tolerance import tolerance

pytestmark = pytest.mark.dist

PROMPT = "circle-right"
STEPS = 2   # exactness does not depend on the number of steps; fewer keep the launches short
# On one rank the designs differ in nothing but bookkeeping: one is enough there.
DESIGNS_AT = {1: ("pass-q",), 2: DESIGNS, 4: DESIGNS}


def stream_every_design(req, designs):
    """Each rank: the same clip streamed once per cache design."""
    import dataclasses

    from cpcourse.runs.stream import rank

    return {d: rank(dataclasses.replace(req, kv_cache=d)) for d in designs}


@pytest.fixture(scope="module")
def request_(cases_rng):
    from cpcourse.runs.stream import check_stream

    return check_stream(1, cases_rng.randrange(1000), prompt=PROMPT, steps=STEPS)


def _clip(request_, results, design):
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.streaming import assemble
    from cpcourse.tinydit.training import to_clip

    cfg = load_weights(request_.path)[0].cfg
    grid = (request_.shape[-2] // cfg.patch, request_.shape[-1] // cfg.patch)
    return to_clip(assemble([r[design]["pieces"] for r in results], request_.chunk, grid,
                            cfg.in_channels, cfg.patch))


@pytest.fixture(scope="module")
def single(request_):
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.sampling import initial_noise
    from cpcourse.tinydit.streaming import stream_latents
    from cpcourse.tinydit.training import to_clip

    model = load_weights(request_.path)[0]
    noise = initial_noise(request_.shape, request_.seed)
    return to_clip(stream_latents(model, noise, request_.label, request_.chunk, STEPS,
                                  request_.cfg_scale))


@pytest.fixture(scope="module", params=[1, 2, 4])
def runs(request, request_):
    world = request.param
    results = launch(f"{__file__}:stream_every_design", world, timeout=300, stream=False,
                     args=(request_, DESIGNS_AT[world]))
    return world, results


def test_every_P_and_cache_design_streams_the_same_clip(runs, request_, single):
    world, results = runs
    for design in DESIGNS_AT[world]:
        err = float((_clip(request_, results, design) - single).abs().max())
        assert err <= tolerance(design, "fp32", request_.cfg_scale), (world, design, err)


def test_cache_bytes_per_chunk_flat_or_growing_with_history(runs, request_):
    """Ulysses and pass-q send the same per chunk whatever the history; pass-kv sends the
    whole cache round the ring, so its bytes grow by the same step per chunk of history."""
    world, results = runs
    for design in DESIGNS_AT[world]:
        sent = [sum(c) for c in zip(*(r[design]["bytes_per_chunk"] for r in results),
                                    strict=True)]
        if world == 1:
            assert sent == [0] * len(sent), design
        elif design == "pass-kv":
            steps = {b - a for a, b in zip(sent, sent[1:], strict=False)}
            assert len(steps) == 1 and steps.pop() > 0, sent
        else:
            assert len(set(sent)) == 1 and sent[0] > 0, (design, sent)
    # the cache a rank holds: all of it for 1/P of the heads, or its 1/P of every chunk
    held = {d: [r[d]["cache_bytes"] for r in results] for d in DESIGNS_AT[world]}
    assert len({tuple(h) for h in held.values()}) == 1 and len(set(held["pass-q"])) == 1


def test_the_model_follows_each_prompt():
    """One seed per prompt, streamed in this process at the default steps: the tracker finds
    the prompt's direction (`cpcourse bench shapes --causal` measures the rate over seeds)."""
    from cpcourse.tinydit.causal import shipped_causal_path
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.moving_shapes import PROMPTS
    from cpcourse.tinydit.streaming import evaluate_causal

    model = load_weights(shipped_causal_path())[0]
    res = evaluate_causal(model, prompts=PROMPTS, seeds=[0])
    missed = [p for p in PROMPTS if res[p]["direction"] < 1]
    assert not missed, missed
