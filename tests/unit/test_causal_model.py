"""The chunk-causal shapes model in one process: training shows what streaming does, the pieces
a rank streams put back together, and `generate --causal` refuses bad input before starting.

    python -m pytest tests/unit/test_causal_model.py -q
"""

import pytest
import torch

from cpcourse.tinydit.causal import TeacherForcing
from cpcourse.tinydit.model import CPContext, DiTConfig, build_model, patchify
from cpcourse.tinydit.streaming import CachedAttention, LocalCache, assemble, chunk_shard

FRAMES, CHUNK, GRID = 6, 2, (2, 3)   # 3 chunks of 2 frames of 6 tokens


@pytest.fixture(scope="module")
def model():
    cfg = DiTConfig(in_channels=3, patch=2, hidden=24, heads=2, depth=2, num_classes=2,
                    num_motions=4, attention="full", prediction="sample", frame_embed=True)
    return build_model(cfg, weight_seed=0, dtype=torch.float64)


def _stream(model, chunks_in, t, y, context=None):
    """Each chunk through the model after the earlier ones: kept at t = 0 from `context` (the
    clean clip), or, without it, the chunk itself kept. Outputs `[B, T, S, F]`."""
    hook, outs = CachedAttention(LocalCache), []
    for first in range(0, FRAMES, CHUNK):
        x, pos = chunk_shard(chunks_in[:, first:first + CHUNK], first, GRID, 0, 1)
        hook.keep = context is None
        outs.append(model(x, t, y, CPContext(grid=GRID, attend=hook, positions=pos)))
        if context is not None:
            hook.keep = True
            clean, _ = chunk_shard(context[:, first:first + CHUNK], first, GRID, 0, 1)
            model(clean, torch.zeros_like(t), y, CPContext(grid=GRID, attend=hook, positions=pos))
    return torch.cat([o.view(o.shape[0], CHUNK, -1, o.shape[-1]) for o in outs], dim=1)


@torch.no_grad()
def test_teacher_forcing_sees_exactly_what_the_stream_sees(model, cases_rng):
    """The clean pass under the block-causal mask is the stream's kept forward; the noisy pass
    is each chunk drafted against the clean chunks before it (float64: equal to rounding)."""
    gen = torch.Generator().manual_seed(cases_rng.randrange(2**31))
    b, s, f = 2, GRID[0] * GRID[1], 12
    x0, xt = (torch.randn(b, FRAMES, s, f, generator=gen, dtype=torch.float64) for _ in range(2))
    t, y = torch.rand(b, generator=gen, dtype=torch.float64), torch.tensor([[0, 1], [2, 4]])
    hook = TeacherForcing(FRAMES, CHUNK, s)
    ctx = CPContext(grid=GRID, attend=hook)
    clean = model(x0, torch.zeros(b, dtype=torch.float64), y, ctx)
    hook.recording = False
    noisy = model(xt, t, y, ctx)
    assert torch.allclose(clean, _stream(model, x0, torch.zeros_like(t), y), atol=1e-12)
    assert torch.allclose(noisy, _stream(model, xt, t, y, context=x0), atol=1e-12)
    # and the mask matters: bidirectional attention gives another answer
    assert not torch.allclose(clean, model(x0, torch.zeros_like(t), y, CPContext(grid=GRID)))


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_rank_pieces_reassemble_the_clip(world, cases_rng):
    """`chunk_shard` over P ranks then `assemble`: the latents back, and the (t, y, x) each rank
    rotates by are the tokens' own, whatever P cuts through a frame."""
    gen = torch.Generator().manual_seed(cases_rng.randrange(2**31))
    latents = torch.randn(1, 3, FRAMES, 2 * GRID[0], 2 * GRID[1], generator=gen)
    tokens = patchify(latents, 2)
    pieces, seen = [], []
    for rank in range(world):
        mine = []
        for first in range(0, FRAMES, CHUNK):
            x, pos = chunk_shard(tokens[:, first:first + CHUNK], first, GRID, rank, world)
            mine.append(x)
            seen.append(pos[0])
            ty, tx = pos[0, :, 1], pos[0, :, 2]
            assert torch.equal(x[0, 0], tokens[0, pos[0, :, 0], ty * GRID[1] + tx])
        pieces.append(mine)
    assert torch.equal(assemble(pieces, CHUNK, GRID, 3, 2), latents)
    assert len({tuple(p) for p in torch.cat(seen).tolist()}) == FRAMES * GRID[0] * GRID[1]


def test_causal_training_writes_a_causal_file(tmp_path):
    """One fine-tuning step from the shipped weights: the file says it is causal, and with
    which chunk, which is what `generate --causal` and `bench shapes --causal` read."""
    from cpcourse.tinydit.causal import train_causal
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.streaming import causal_chunk

    out = str(tmp_path / "c.safetensors")
    res = train_causal(out, steps=1, threads=1)
    assert res["steps"] == 1 and causal_chunk(out) == CHUNK
    assert load_weights(out)[1]["causal"]["init"] == "shipped"


@pytest.mark.parametrize("argv, words", [
    (["--chunk", "3"], "chunk 3 must divide the clip's 8 frames"),
    (["--chunk", "8"], "--chunk 8: this model was trained with chunk 2"),   # probe #7
    (["--chunk", "2", "--weights", "cpcourse/data/shapes_dit.safetensors"],
     "not a chunk-causal model"),
    (["--kv-cache", "ulysses", "--nproc", "3"], "the world size must divide the head count"),
    (["--frames", "16"], "--frames has no effect here"),
    (["--layout", "ring=2"], "--layout has no effect here"),
    (["--weights", "random"], "the random DiT is not causal"),
])
def test_causal_generate_refuses_before_starting(capsys, monkeypatch, argv, words):
    from cpcourse import launch as launch_mod
    from cpcourse.cli import main

    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: pytest.fail("a process started"))
    code = main(["generate", "--causal", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and words in err and err.count("\n") == 1, err


def test_kv_cache_needs_causal(capsys):
    from cpcourse.cli import main

    assert main(["generate", "--kv-cache", "pass-q"]) == 2
    assert "--kv-cache has no effect here: it needs --causal" in capsys.readouterr().err


def test_the_default_timeout_grows_with_the_steps(monkeypatch, capsys):
    """Probe #9: `--steps 400` ran into the 120 s default and read as "a deadlock?"."""
    from cpcourse.cli import main
    from cpcourse.tinydit.training import SAMPLE_STEPS

    seen = {}

    def fake_run(req, stream=False):
        seen["timeout"] = req.timeout
        raise KeyboardInterrupt  # stop before any process starts

    monkeypatch.setattr("cpcourse.runs.stream.run", fake_run)
    for steps, want in ((SAMPLE_STEPS, 120.0), (4 * SAMPLE_STEPS, 480.0), (1000, 3600.0)):
        assert main(["generate", "--causal", "--nproc", "1", "--steps", str(steps)]) == 130
        assert seen["timeout"] == pytest.approx(min(want, 3600.0))
    assert main(["generate", "--causal", "--nproc", "1", "--timeout", "7"]) == 130
    assert seen["timeout"] == 7.0
    capsys.readouterr()
