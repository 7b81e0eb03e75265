"""The trained shapes model sampled on P ranks with its attention traffic sent as fp32, bf16 or
fp8: `cpcourse generate --comm-dtype`.

    cpcourse generate --prompt circle-right --nproc 2 --comm-dtype fp8 --compare --json

Every full-attention layer runs Ulysses (`cpcourse.sparse_cp.ulysses_sparse` with every block
kept): q, k, v go out and the output comes back through a codec (`cpcourse.fp8_comm`):
"fp8" scales per token and head, "fp8-tensor" calibrates one scale per layer on the first step
(the largest |q|, |k|, |v| on any rank) and keeps it. The report adds `comm_bytes` (every
rank's bytes over the whole sampling, scales included), `comm_bytes_bf16` (the same messages in
bf16), `psnr` against the exact clip (one process; None when identical), `tracked` (the
tracker sees the prompted shape moving the prompted way) and `max_abs_diff_vs_exact`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.fp8_comm import COMM_DTYPES, Codec, calibrated_scale
from cpcourse.launch import launch
from cpcourse.sparse import BlockMask
from cpcourse.sparse_cp import ulysses_sparse
from cpcourse.support.errors import require


@dataclass(frozen=True)
class CommRequest:
    """One clip with its attention traffic in `comm_dtype` (fp32 is exact Ulysses)."""

    prompt: str = "circle-right"
    seed: int = 0
    nproc: int = 2
    comm_dtype: str = "fp8"
    timeout: float = 300.0

    def __post_init__(self):
        require(self.comm_dtype in COMM_DTYPES,
                f"comm_dtype must be one of {', '.join(COMM_DTYPES)}, got {self.comm_dtype!r}")
        run = self.generate()
        heads = run.cfg.heads
        require(run.cfg.attention == "full", "comm_dtype sends full attention's q, k, v: these "
                "weights use factored attention")
        require(heads % self.nproc == 0 and run.shape[2] % self.nproc == 0,
                f"nproc {self.nproc}: Ulysses needs it to divide the {heads} heads and the "
                f"{run.shape[2]} frames; use one of "
                f"{[p for p in range(1, heads + 1) if heads % p == 0 == run.shape[2] % p]}")

    def generate(self):
        from cpcourse.runs.generate import check_request

        return check_request(self.nproc, self.seed, prompt=self.prompt)


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

    r, world = dist.get_rank(), dist.get_world_size()
    spec = req.generate().rank_spec()
    model = spec_model(spec)
    _, _, t, hl, wl = spec["shape"]
    grid = (hl // model.cfg.patch, wl // model.cfg.patch)
    noise = torch.tensor_split(initial_noise(tuple(spec["shape"]), spec["seed"]), world,
                               dim=2)[r].contiguous()
    hook = _Hook(req.comm_dtype, (t, *grid))
    ctx = CPContext(group=dist.group.WORLD, frame_offset=frame_offset(t, r, world), grid=grid,
                    attend=hook)
    with torch.inference_mode():
        frames = sample(model, noise, spec["label"], spec["steps"], spec["cfg_scale"], ctx)
    sent = sum(st["bytes_sent"] for st in hook.stats)
    fp32 = sum(st["dense_bytes"] for st in hook.stats)
    return {"frames": frames, "comm_bytes": int(sent), "comm_bytes_bf16": int(fp32 // 2)}


def run(req: CommRequest, compare: bool = True) -> dict:
    """Launch the ranks; the report as the module docstring says."""
    from cpcourse.approx.quality import psnr
    from cpcourse.tinydit.moving_shapes import matches, track
    from cpcourse.tinydit.sampling import single_process_sample
    from cpcourse.tinydit.training import to_clip

    results = launch("cpcourse.runs.comm_generate:rank", req.nproc, timeout=req.timeout,
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
        exact = to_clip(single_process_sample(req.generate().rank_spec()))
        rep.update(psnr=psnr(clip, exact),
                   max_abs_diff_vs_exact=float((clip - exact).abs().max()),
                   exact=req.comm_dtype == "fp32")
    return rep
