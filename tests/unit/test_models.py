"""cpcourse.models in one process: tiny real models, shard rotary rows, refusals, the sampler, CLI.

    python -m pytest tests/unit/test_models.py -q
"""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.cli import main
from cpcourse.models import ARCHS, build, example_inputs, parallelize
from cpcourse.models.build import arch_info, cast, latent_shape
from cpcourse.models.compare import tolerance
from cpcourse.models.processors import text_keep_lengths
from cpcourse.models.rotary import hunyuan_rope_shard, wan_rope_shard
from cpcourse.models.sampler import sample
from cpcourse.models.split import SPLITS
from cpcourse.support.errors import InputError
from cpcourse.support.shards import shard_offsets, shard_sizes, video_shard_sizes

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def wan():
    return build("wan")


@settings(max_examples=25, deadline=None)
@given(frames=st.integers(1, 9), h=st.integers(1, 6), w=st.integers(1, 6),
       world=st.integers(1, 4))
def test_shard_rotary_rows_equal_the_whole_table(frames, h, w, world):
    wan, hy = build("wan"), build("hunyuanvideo")
    latents = torch.zeros(1, 4, frames, 2 * h, 2 * w)
    whole = {"wan": wan.rope(latents), "hy": hy.rope(latents)}
    sizes = shard_sizes(frames, world)
    for f0, nf in zip(shard_offsets(sizes), sizes, strict=True):
        if nf == 0:
            continue
        rows = slice(f0 * h * w, (f0 + nf) * h * w)
        for got, want in zip(wan_rope_shard(wan.rope, f0, nf, h, w), whole["wan"], strict=True):
            assert torch.equal(got, want[:, rows])
        for got, want in zip(hunyuan_rope_shard(hy.rope, f0, nf, h, w), whole["hy"],
                             strict=True):
            assert torch.equal(got, want[rows])


@settings(max_examples=25, deadline=None)
@given(frames=st.integers(1, 5), h=st.integers(1, 4), w=st.integers(1, 4),
       world=st.integers(1, 7), split=st.sampled_from(SPLITS))
def test_the_rotary_hook_gives_each_rank_its_rows_under_either_split(frames, h, w, world,
                                                                      split):
    """A token shard may start and end mid-frame: its rows are still the whole table's."""
    from types import SimpleNamespace

    from cpcourse.models.parallel import rope_hook

    wan, hy = build("wan"), build("hunyuanvideo")
    latents = torch.zeros(1, 4, frames, 2 * h, 2 * w)
    lens = video_shard_sizes(frames, h * w, world, split)
    for rank, (tok0, n) in enumerate(zip(shard_offsets(lens), lens, strict=True)):
        if n == 0:
            continue
        cp = SimpleNamespace(lens=lens, rank=rank, tok0=tok0, per_frame=h * w)
        for model, arch, dim in ((wan, "wan", 1), (hy, "hunyuanvideo", 0)):
            whole = model.rope(latents)
            got = rope_hook(cp, arch_info(arch).cp)(model.rope, (latents,), whole)
            for g, want in zip(got, whole, strict=True):
                assert torch.equal(g, want.narrow(dim, tok0, n)), (arch, rank)


@settings(max_examples=50, deadline=None)
@given(frames=st.integers(1, 40), per_frame=st.integers(1, 64), world=st.integers(1, 16))
def test_frame_and_token_splits_cover_the_video(frames, per_frame, world):
    by_frame = video_shard_sizes(frames, per_frame, world, "frames")
    by_token = video_shard_sizes(frames, per_frame, world, "tokens")
    assert sum(by_frame) == sum(by_token) == frames * per_frame
    assert all(n % per_frame == 0 for n in by_frame) and max(by_token) - min(by_token) <= 1
    assert max(by_frame) >= max(by_token)  # the frame split's busiest rank never holds less


def test_the_planner_counts_the_busiest_rank_as_the_library_splits():
    from cpcourse.planner.tokens import model_tokens

    tok = model_tokens("wan2.1-t2v-1.3b")  # 21 latent frames of 1,560 tokens at 480p
    frames, tokens = (max(tok.rank_video_tokens(8, s)) for s in SPLITS)
    assert (frames, tokens) == (3 * tok.tokens_per_frame, -(-tok.video_tokens // 8))
    assert 1.14 < frames / tokens < 1.15  # 4,680 vs 4,095: 14% more on the critical path


def test_rotary_table_too_short_is_refused(wan):
    with pytest.raises(InputError, match="rope_max_seq_len >= 70"):
        wan_rope_shard(wan.rope, 60, 10, 4, 4)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tiny_models_build_seeded_and_run(arch):
    state = torch.random.get_rng_state()
    a, b, c = build(arch, seed=1), build(arch, seed=1), build(arch, seed=2)
    assert torch.equal(torch.random.get_rng_state(), state), "build moved the caller's seed"
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    inputs = example_inputs(arch, frames=3, height=4, width=6)
    with torch.no_grad():
        out = a(**inputs, return_dict=False)[0]
    assert out.shape == latent_shape(arch, 3, 4, 6) and torch.isfinite(out).all()


def test_bad_builds_and_inputs_are_refused():
    with pytest.raises(InputError, match="unknown arch 'ltx2'"):
        build("ltx2")
    with pytest.raises(InputError, match="no config entries"):
        build("wan", heads=3)
    with pytest.raises(InputError, match="from_pretrained"):
        build("wan", tiny=False)
    with pytest.raises(InputError, match="multiples of 2"):
        example_inputs("wan", height=7)


@pytest.mark.parametrize("overrides,words", [
    ({"num_layers": 0}, "num_layers must be > 0"),  # was an IndexError in parallelize
    ({"num_attention_heads": 0}, "num_attention_heads must be > 0"),  # ZeroDivisionError
    ({"num_attention_heads": 2.5}, "num_attention_heads must be a whole number"),
    ({"ffn_dim": -64}, "ffn_dim must be > 0"),
    ({"patch_size": (1, 0, 2)}, r"patch_size\[1\] must be > 0"),
    ({"cross_attn_norm": 1}, "cross_attn_norm must be True or False"),
])
def test_size_overrides_must_be_positive(overrides, words):
    with pytest.raises(InputError, match=words):
        build("wan", **overrides)


def test_hunyuanvideo_may_drop_one_kind_of_block_not_both():
    assert len(build("hunyuanvideo", num_layers=0).single_transformer_blocks) == 1
    with pytest.raises(InputError, match="needs at least one block"):
        build("hunyuanvideo", num_layers=0, num_single_layers=0)


def _folder(root, config) -> str:
    (root / "transformer").mkdir(parents=True)
    (root / "transformer" / "config.json").write_text(config)
    return str(root)


def test_from_pretrained_refuses_local_paths_before_diffusers(tmp_path, monkeypatch):
    from cpcourse.models import from_pretrained, pretrained

    class Unreachable:  # a refusal that reached diffusers could have gone to the network
        @staticmethod
        def from_pretrained(*args, **kwargs):
            raise AssertionError(f"diffusers was called with {args}")

    monkeypatch.setattr(pretrained, "model_class", lambda arch: Unreachable)
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = {"/nonexistent/path/model": "no such file or folder",
             "": "path_or_id is empty",
             str(tmp_path / "empty"): r"has no transformer/config\.json",
             _folder(tmp_path / "bad", "{not json"): "not readable JSON",
             _folder(tmp_path / "cog", '{"_class_name": "CogVideoXTransformer3DModel"}'):
                 "is for a CogVideoXTransformer3DModel",
             str(tmp_path / "file.txt"): "is a file, not a folder"}
    for path, words in cases.items():
        with pytest.raises(InputError, match=words):
            from_pretrained("wan", path)
    with pytest.raises(InputError, match="path_or_id must be"):
        from_pretrained("wan", 3)
    assert not pretrained.looks_local("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")
    assert all(pretrained.looks_local(p) for p in ("a/b/c", "./wan", "~/wan", "a b"))


def test_from_pretrained_loads_a_local_folder_and_names_missing_weights(tmp_path, monkeypatch):
    from cpcourse.models import from_pretrained, pretrained

    # CogVideoX: no float32-kept modules, so diffusers loads it without accelerate
    model = build("cogvideox")
    model.save_pretrained(tmp_path / "ok" / "transformer")
    loaded = from_pretrained("cogvideox", tmp_path / "ok", dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 loaded.state_dict().values(), strict=True))
    (tmp_path / "ok" / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    with pytest.raises(InputError, match="diffusers could not load CogVideoXTransformer3DModel"):
        from_pretrained("cogvideox", tmp_path / "ok")
    # Wan keeps modules in float32: without accelerate, diffusers would refuse after the download
    monkeypatch.setattr(pretrained, "has_accelerate", lambda: False)
    with pytest.raises(InputError, match="pip install accelerate"):
        from_pretrained("wan", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers")


def test_cast_keeps_the_fp32_modules(wan):
    model = cast(build("wan"), torch.bfloat16)
    assert model.rope.freqs_cos.dtype == torch.float32  # not rounded to bf16
    assert model.scale_shift_table.dtype == torch.float32
    assert model.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16


def test_parallelize_refusals(wan):
    with pytest.raises(InputError, match="initialised process group"):
        parallelize(wan)
    with pytest.raises(InputError, match="supports CogVideoXTransformer3DModel"):
        parallelize(torch.nn.Linear(2, 2))
    with pytest.raises(InputError, match="method must be one of"):
        parallelize(wan, method="zigzag")


def test_text_mask_may_only_pad_the_end():
    good = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool).view(1, 1, 1, 6)
    assert text_keep_lengths(good, 3) == [2]
    bad = torch.tensor([[1, 1, 1, 0, 1, 1]], dtype=torch.bool).view(1, 1, 1, 6)
    with pytest.raises(InputError, match="END of the text"):
        text_keep_lengths(bad, 3)


def _count_forwards(model):
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    return calls


@pytest.mark.parametrize("arch,per_step", [("wan", 2), ("hunyuanvideo", 1), ("cogvideox", 2)])
def test_sampler_cfg_pair_or_one_distilled_forward(arch, per_step):
    model = build(arch)
    calls = _count_forwards(model)
    inputs = example_inputs(arch, frames=2, height=4, width=4)
    a = sample(model, arch, inputs, steps=3, seed=5)
    assert len(calls) == 3 * per_step
    with torch.random.fork_rng():  # another global RNG state: the noise must not read it
        torch.manual_seed(99)
        torch.randn(3)
        b = sample(model, arch, inputs, steps=3, seed=5)
    c = sample(model, arch, inputs, steps=3, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.shape == inputs["hidden_states"].shape and torch.isfinite(a).all()


def _cli(capsys, *argv):
    code = main(["models", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv,words", [
    (["--arch", "sora"], "--arch must be one of"),
    (["--arch", "wan", "--nproc", "4", "--frames", "3"], "give --frames 4 or more"),
    (["--arch", "wan", "--nproc", "0"], "nproc"),
    (["--arch", "wan", "--method", "zigzag"], "--method must be one of"),
    (["--arch", "wan", "--nproc", "4", "--method", "usp", "--ulysses", "3"], "must divide"),
    (["--arch", "wan", "--height", "9"], "multiples of 2"),
    (["--arch", "wan", "--frames", "64", "--height", "64", "--width", "128"], "65,536"),
    (["--arch", "wan", "--sample-steps", "0"], "sample-steps"),
])
def test_models_cli_refuses_in_one_line(capsys, argv, words):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and words in err and err.count("\n") == 1 and not out, err


def test_models_cli_names_the_ulysses_degrees_that_work(capsys):
    # 12 heads on 8 ranks, like Wan 2.1 1.3B on one 8-GPU node
    code, _, err = _cli(capsys, "--arch", "wan", "--nproc", "8", "--frames", "8", "--method",
                        "ulysses")
    assert code == 2 and "12 heads" in err and "1, 2, 4" in err and "ring" in err, err


def test_bench_models_is_listed(capsys):
    assert main(["bench", "--help"]) == 0
    assert "models" in capsys.readouterr().out


def test_models_cli_json_keys(capsys):
    code, out, _ = _cli(capsys, "--arch", "wan", "--nproc", "1", "--frames", "2", "--height",
                        "4", "--width", "4", "--repeat", "0", "--compare", "--json")
    d = json.loads(out)
    assert code == 0
    for key in ("arch", "method", "nproc", "tokens", "max_abs_err", "seconds_cp",
                "seconds_single", "within_tolerance", "frame_sizes"):
        assert key in d, key
    assert d["tokens"] == 8 and d["max_abs_err"] == 0.0 and d["within_tolerance"]
    assert d["tolerance"] == tolerance(d["method"], scale=d["max_abs_output"])


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
@pytest.mark.parametrize("method", ["allgather", "ring"])
def test_tolerance_scales_with_the_output_not_below_one(method, dtype):
    unit = tolerance(method, dtype)
    assert tolerance(method, dtype, scale=0.25) == unit  # small outputs keep the absolute floor
    assert tolerance(method, dtype, scale=2.56) == pytest.approx(2.56 * unit)
    # a sample's last step returns the guided prediction: g = 4 multiplies the error by 1 + 2g
    assert tolerance(method, dtype, guidance=4.0, scale=4.0) == pytest.approx(36 * unit)
    assert tolerance(method, dtype, guidance=-4.0) == tolerance(method, dtype, guidance=4.0)


@settings(max_examples=40, deadline=None)
@given(st.floats(-100, 100), st.floats(0, 1e3))
def test_guidance_never_tightens_the_tolerance(g, scale):
    assert tolerance("ring", guidance=g, scale=scale) >= tolerance("ring", scale=scale)
    assert tolerance("ulysses", guidance=g, scale=scale) < tolerance("ring", guidance=g,
                                                                      scale=scale)


def test_tolerance_accepts_a_correct_cogvideox_run():
    # `models --arch cogvideox --nproc 4 --frames 4 --method allgather --batch 2 --compare`:
    # 1.19e-6 on outputs up to 2.56 was flagged OUTSIDE an absolute 1e-6
    assert 1.19e-6 <= tolerance("allgather", scale=2.56) < 3e-6
    assert tolerance("allgather", "bfloat16", scale=2.56) > tolerance("allgather", scale=2.56)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_arch_cp_plan_names_what_its_diffusers_class_has(arch):
    """The per-architecture table (`CPPlan`) is what the hooks read: its block lists, rotary
    module and refused config keys exist on the real class."""
    plan, model = arch_info(arch).cp, build(arch)
    assert any(len(getattr(model, name)) for name in plan.first_blocks)
    assert (plan.rope is not None) == hasattr(model, "rope")
    for key, _, why in plan.refuse + plan.refuse_shard_io:
        assert key in model.config and why


@pytest.mark.parametrize("fields,words", [
    # these three were refused inside the ranks (tests/dist/test_models_cp.py); the Request
    # refuses them before any process starts, with the same meaning
    ({"arch": "wan", "method": "ulysses", "config": {"num_attention_heads": 4}},
     ("4 heads over 3 ranks", "work on 3 ranks are 1", "the ring has no such limit")),
    ({"arch": "hunyuanvideo", "method": "usp", "ulysses": 2}, ("ulysses 2 must divide nproc=3",)),
    ({"arch": "wan", "method": "ring", "frames": 2},
     ("splits the 2 latent frames over 3 ranks", "give frames=3 or more")),
    ({"arch": "wan", "layout": "cfg=2,ring=2"}, ("layout cfg2 x ring2 needs 4 ranks",)),
    ({"arch": "wan", "repeat": 21}, ("repeat 21: use at most 20",)),
    ({"arch": "wan", "split": "tokens", "shard_io": True}, ("shard_io hands each rank",)),
])
def test_the_models_request_refuses_before_any_process_starts(fields, words):
    from cpcourse.runs.models import ModelsRequest

    with pytest.raises(InputError) as exc:
        ModelsRequest(nproc=3, **fields)
    for w in words:
        assert w in str(exc.value), str(exc.value)


def test_the_models_request_is_what_the_ranks_read():
    from cpcourse.runs.models import ModelsRequest, as_request

    req = as_request({"arch": "wan", "layout": {"cfg": 2, "ulysses": 2}, "sample_steps": 2})
    assert req.nproc == 4 and req.layout.cfg == 2 and req.tokens == 5 * 16
    assert ModelsRequest(arch="wan").nproc == 2 and as_request(req, nproc=4) == req
    with pytest.raises(InputError, match="needs 4 ranks"):
        as_request(req, nproc=2)
    with pytest.raises(AttributeError):
        req.frames = 3  # frozen: a Request that exists was checked


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.sampled_from(["frames", "tokens"]))
def test_a_frame_split_needs_a_frame_per_rank(nproc, frames, split):
    from cpcourse.runs.models import ModelsRequest

    try:
        ModelsRequest(arch="wan", method="ring", nproc=nproc, frames=frames, split=split)
        ok = True
    except InputError:
        ok = False
    assert ok == (frames >= nproc or split == "tokens")
