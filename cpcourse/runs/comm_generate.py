"""The trained shapes model sampled on P ranks with its attention traffic sent as fp32, bf16 or
fp8: `cpcourse generate --comm-dtype`.

    cpcourse generate --prompt circle-right --nproc 2 --comm-dtype fp8 --compare --json

Every full-attention layer runs Ulysses (`cpcourse.sparse.cp.ulysses_sparse` with every block
kept): q, k, v go out and the output comes back through a codec (`cpcourse.fp8_comm`):
"fp8" scales per token and head, "fp8-tensor" calibrates one scale per layer on the first step
(the largest |q|, |k|, |v| on any rank) and keeps it. The report adds `comm_bytes` (every
rank's bytes over the whole sampling, scales included), `comm_bytes_bf16` (the same messages in
bf16), `psnr` against the exact clip (one process; None when identical), `tracked` (the
tracker sees the prompted shape moving the prompted way) and `max_abs_diff_vs_exact`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cpcourse.fp8_comm import COMM_DTYPES, Codec, calibrated_scale
from cpcourse.launch import launch
from cpcourse.sparse import BlockMask
from cpcourse.sparse.cp import ulysses_sparse
from cpcourse.support.errors import positive_float, require
from cpcourse.support.request import check_common, flag, set_derived


@dataclass(frozen=True)
class CommRequest:
    """One clip with its attention traffic in `comm_dtype` (fp32 is exact Ulysses): the fields
    are `cpcourse generate --comm-dtype`'s flags; `run` is the plain GenerateRequest it
    samples (the shipped model at its own size and settings, in fp32)."""

    prompt: str = flag("circle-right", "what the trained model draws")
    seed: int = flag(0, "noise seed")
    nproc: int = flag(2, "ranks")
    comm_dtype: str = flag("fp8", "send attention's q, k, v and out as fp32, bf16 or fp8 "
                           "(Ulysses; --compare: PSNR vs the exact clip)", choices=COMM_DTYPES,
                           acts="comm")
    compare: bool = flag(True, "also sample the exact clip here: PSNR and largest difference")
    timeout: float = flag(300.0, "seconds the ranks may run")
    run: object = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        from cpcourse.runs.generate import GenerateRequest

        check_common(self)
        positive_float("timeout", self.timeout, high=3600)
        run = GenerateRequest(nproc=self.nproc, seed=self.seed, prompt=self.prompt)
        heads, frames = run.cfg.heads, run.shape[2]
        require(run.cfg.attention == "full", "comm_dtype sends full attention's q, k, v: these "
                "weights use factored attention")
        require(heads % self.nproc == 0 and frames % self.nproc == 0,
                f"nproc {self.nproc}: Ulysses needs it to divide the {heads} heads and the "
                f"{frames} frames; use one of "
                f"{[p for p in range(1, heads + 1) if heads % p == 0 == frames % p]}")
        set_derived(self, run=run)

    def generate(self):
        """The plain GenerateRequest this run samples (`run`)."""
        return self.run


class _Hook:
    """ctx.attend for every full-attention layer: Ulysses through the codec, bytes summed."""

    def __init__(self, kind: str, grid):
        self.kind, self.grid, self.scales, self.stats = kind, grid, {}, []

    def __call__(self, layer, q, k, v):               # [B, H, T_r, S, D] each
        import torch.distributed as dist

        b, h, t, s, d = q.shape
        if self.kind == "fp8-tensor" and id(layer) not in self.scales:  # calibrate once
            amax = torch.stack([x.abs().amax() for x in (q, k, v)]).amax().reshape(1).float()
            dist.all_reduce(amax, op=dist.ReduceOp.MAX)
            self.scales[id(layer)] = calibrated_scale(float(amax))
        codec = Codec(self.kind, self.scales.get(id(layer)))
        frames = self.grid[0]
        bm = BlockMask(torch.ones(h, frames, frames, dtype=torch.bool), self.grid,
                       (1, *self.grid[1:]))
        st: dict = {}
        out = ulysses_sparse(*(x.reshape(b, h, t * s, d) for x in (q, k, v)), bm, codec=codec,
                             stats=st)                  # [B, H, T_r * S, D]
        self.stats.append(st)
        return out.reshape(b, h, t, s, d)


def rank(req: CommRequest) -> dict:
    """On each rank: its frames of the clip, the bytes it sent (and would in bf16)."""
    import torch.distributed as dist

    from cpcourse.tinydit.model import CPContext
    from cpcourse.tinydit.sampling import initial_noise, sample, spec_model
    from cpcourse.video import frame_offset

    r, world, run = dist.get_rank(), dist.get_world_size(), req.run
    model = spec_model(run)
    _, _, t, hl, wl = run.shape
    grid = (hl // model.cfg.patch, wl // model.cfg.patch)
    noise = torch.tensor_split(initial_noise(tuple(run.shape), run.seed), world,
                               dim=2)[r].contiguous()  # [B, C, T/P, Hl, Wl]
    hook = _Hook(req.comm_dtype, (t, *grid))
    ctx = CPContext(group=dist.group.WORLD, frame_offset=frame_offset(t, r, world), grid=grid,
                    attend=hook)
    with torch.inference_mode():  # frames: this rank's sample [B, C, T/P, Hl, Wl]
        frames = sample(model, noise, run.cond, run.steps, run.cfg_scale, ctx)
    sent = sum(st["bytes_sent"] for st in hook.stats)
    fp32 = sum(st["dense_bytes"] for st in hook.stats)
    return {"frames": frames, "comm_bytes": int(sent), "comm_bytes_bf16": int(fp32 // 2)}


def run(req: CommRequest, compare: bool | None = None) -> dict:
    """Launch the ranks; the report as the module docstring says."""
    from cpcourse.approx.quality import psnr
    from cpcourse.tinydit.moving_shapes import matches, track
    from cpcourse.tinydit.sampling import single_process_sample
    from cpcourse.tinydit.training import to_clip

    compare = req.compare if compare is None else compare
    results = launch(rank, req.nproc, timeout=req.timeout,
                     args=(req,), stream=False, threads=1)
    clip = to_clip(torch.cat([res["frames"] for res in results], dim=2))
    seen = track(clip)
    ok = matches(req.prompt, seen)
    rep = {"prompt": req.prompt, "seed": req.seed, "nproc": req.nproc,
           "comm_dtype": req.comm_dtype,
           "comm_bytes": sum(res["comm_bytes"] for res in results),
           "comm_bytes_bf16": sum(res["comm_bytes_bf16"] for res in results),
           "tracked": bool(ok["direction"] and ok["shape"]),
           "track": {"direction": seen["direction"], "shape": seen["shape"]}}
    if compare:
        exact = to_clip(single_process_sample(req.run))
        rep.update(psnr=psnr(clip, exact),
                   max_abs_diff_vs_exact=float((clip - exact).abs().max()),
                   exact=req.comm_dtype == "fp32")
    return rep


def print_report(report: dict) -> None:
    """`run`'s report, a few lines for a terminal."""
    print(f"{report['prompt']} (seed {report['seed']}) on {report['nproc']} ranks, attention "
          f"traffic in {report['comm_dtype']}: {report['comm_bytes'] / 1e6:.2f} MB sent (bf16: "
          f"{report['comm_bytes_bf16'] / 1e6:.2f} MB); tracker: {report['track']['shape']} "
          f"moving {report['track']['direction']} ({'as' if report['tracked'] else 'NOT as'} "
          f"prompted)")
    if "psnr" in report:
        p = "identical" if report["psnr"] is None else f"PSNR {report['psnr']:.1f} dB"
        print(f"  against the exact clip: {p}, max |difference| "
              f"{report['max_abs_diff_vs_exact']:.3g}")
