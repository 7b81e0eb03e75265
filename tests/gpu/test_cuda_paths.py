"""The CUDA paths a GPU box takes, against float64 or the CPU: `pytest -m gpu tests/gpu`.

    python -m pytest -m gpu tests/gpu -q        # on a CUDA machine (skipped elsewhere)

`cpcourse bench gpu` runs these with every other `gpu`-marked test. Tolerances are the library's
own: `cpcourse.attention.TOLERANCES` per dtype; bf16 for whole models as the tests of
`cpcourse.models` state it. The one-GPU process group is real NCCL: what a multi-GPU box runs,
at one rank.
"""

from __future__ import annotations

import pytest
import torch

from cpcourse import attention as A
from cpcourse.launch import launch
from cpcourse.support.errors import InputError

CUDA_BACKENDS = ("flash-attn", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _qkv(lq, lk, d=64, h=3, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, n, d, generator=gen, dtype=torch.float64).to(dtype)
            for n in (lq, lk, lk)]


def _close(got, want, dtype, part):
    atol, rtol = A.TOLERANCES[dtype][part]
    err = (got.double().cpu() - want).abs()
    assert bool((err <= atol + rtol * want.abs()).all()), f"{part}: max error {float(err.max())}"


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_merge_of_two_key_blocks_equals_one_call(backend, dtype):
    """What one ring step does on a GPU: two key blocks, each attended with its lse, merged."""
    q, k, v = _qkv(211, 389, dtype=dtype)
    qc, kc, vc = (t.cuda() for t in (q, k, v))
    cut = 150
    try:
        a = A.attention_with_lse(qc, kc[:, :, :cut], vc[:, :, :cut], backend=backend)
        b = A.attention_with_lse(qc, kc[:, :, cut:], vc[:, :, cut:], backend=backend)
    except InputError as exc:
        pytest.skip(str(exc))
    out, lse = A.merge_attention(*a, *b)
    assert out.device.type == "cuda" and out.dtype == torch.float32
    want_out, want_lse = A.reference_attention(q.double(), k.double(), v.double())
    _close(out.to(dtype), want_out, dtype, "out")
    _close(lse, want_lse, dtype, "lse")


def run_cp_attention(seed: int) -> dict:
    """On one NCCL rank: ring and Ulysses on CUDA bf16 inputs, outputs back on the CPU."""
    import torch.distributed as dist

    from cpcourse.ring import ring_attention
    from cpcourse.ulysses import ulysses_attention

    assert dist.get_backend() == "nccl"
    q, k, v = (t.cuda() for t in _qkv(300, 300, h=4, dtype=torch.bfloat16, seed=seed))
    return {"ring": ring_attention(q, k, v).float().cpu(),
            "ulysses": ulysses_attention(q, k, v).float().cpu()}


def test_ring_and_ulysses_on_a_one_rank_nccl_group():
    got = launch("tests/gpu/test_cuda_paths.py:run_cp_attention", 1, args=(3,), timeout=120,
                 backend="nccl", stream=False)[0]
    q, k, v = _qkv(300, 300, h=4, dtype=torch.bfloat16, seed=3)
    want, _ = A.reference_attention(q.double(), k.double(), v.double())
    for name in ("ring", "ulysses"):
        _close(got[name].to(torch.bfloat16), want, torch.bfloat16, "out")


def test_tiny_dit_generates_the_cpu_clip_on_cuda():
    """The trained shapes model: fp32 on CUDA is the CPU clip (TF32 off); bf16 moves pixels by
    at most 0.25 (mean 0.02) and the clip is still a circle moving right."""
    from cpcourse.tinydit.moving_shapes import track
    from cpcourse.tinydit.training import generate_clip, load_shapes_model

    want = generate_clip(load_shapes_model(), "circle-right", seed=5)
    torch.backends.cuda.matmul.allow_tf32 = False
    got32 = generate_clip(load_shapes_model().cuda(), "circle-right", seed=5).cpu()
    got16 = generate_clip(load_shapes_model(dtype=torch.bfloat16).cuda(), "circle-right",
                          seed=5).float().cpu()
    err32, err16 = (float((g - want).abs().max()) for g in (got32, got16))
    assert err32 <= 1e-3, err32
    # bf16 keeps 8 bits of mantissa through 12 blocks and every step: pixels move, the clip not
    assert err16 <= 0.25 and float((got16 - want).abs().mean()) <= 0.02, err16
    assert track(got16)["direction"] == track(want)["direction"] == "right"


def run_wan_bf16() -> torch.Tensor:
    from cpcourse.models import build, example_inputs, parallelize

    model = build("wan", dtype=torch.bfloat16).cuda()
    inputs = {k: v.cuda() for k, v in example_inputs("wan", frames=6, seed=2,
                                                     dtype=torch.bfloat16).items()}
    parallelize(model, method="ring")
    with torch.inference_mode():
        return model(**inputs, return_dict=False)[0].float().cpu()


def test_parallelized_wan_in_bf16_on_a_one_rank_nccl_group():
    from cpcourse.models import build, example_inputs

    got = launch("tests/gpu/test_cuda_paths.py:run_wan_bf16", 1, timeout=180, backend="nccl",
                 stream=False)[0]
    model = build("wan", dtype=torch.bfloat16).cuda()
    inputs = {k: v.cuda() for k, v in example_inputs("wan", frames=6, seed=2,
                                                     dtype=torch.bfloat16).items()}
    with torch.inference_mode():
        want = model(**inputs, return_dict=False)[0].float().cpu()
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 2e-2 * max(1.0, scale)
