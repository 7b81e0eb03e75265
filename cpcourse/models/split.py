"""Where a parallelized model's sequence is split and gathered: the hooks `parallelize` installs.

    python -m cpcourse.cli models --arch wan --nproc 3 --split tokens --compare --json

Two ways to split the video tokens over P ranks (`parallelize(..., split=...)`):
- "frames" (the default): whole latent frames per rank (`tensor_split` of the frames). A shard is
  a run of frames, so a rank's rotary rows are its frames' rows; with F frames on P ranks the
  busiest rank holds ceil(F / P) frames: Wan 2.1 at 480p, 21 latent frames of 1,560 tokens on 8
  ranks, is 3 frames (4,680 tokens) on the busiest against 4,095 on average, 14% more work on
  the critical path.
- "tokens": the flattened sequence split evenly (`tensor_split` of the tokens, sizes differing
  by at most one), the split the planner's cost model assumes. A shard may start and end inside a
  frame: its rotary rows are cut from the table of the frames it touches.
"""

from __future__ import annotations

import torch

from cpcourse.models.rotary import slice_tokens
from cpcourse.support.errors import InputError, require
from cpcourse.support.groups import agree, all_gather_single, comm_device, gather_uneven
from cpcourse.support.shards import shard_offsets, shard_sizes, video_shard_sizes

SPLITS = ("frames", "tokens")


def latent_grid(model, latents: torch.Tensor) -> tuple[int, int, int]:
    """(latent frames after patchify, rows, columns) of the token grid."""
    name, cfg = type(model).__name__, model.config
    require(isinstance(latents, torch.Tensor) and latents.dim() == 5,
            f"{name} takes latents of 5 dims, got "
            f"{tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents)}")
    if name == "WanTransformer3DModel":
        pt, ph, pw = cfg.patch_size
        _, _, f, h, w = latents.shape
    elif name == "HunyuanVideoTransformer3DModel":
        pt, ph, pw = cfg.patch_size_t, cfg.patch_size, cfg.patch_size
        _, _, f, h, w = latents.shape
    else:  # CogVideoX: [B, F, C, H, W]
        pt, ph, pw = cfg.patch_size_t or 1, cfg.patch_size, cfg.patch_size
        _, f, _, h, w = latents.shape
    require(f % pt == 0, f"{name} groups {pt} latent frames per patch: give a multiple of {pt}"
            f" frames, got {f}")
    return f // pt, h // ph, w // pw


def _split(cp, frames_here: int, per_frame: int, latents: torch.Tensor) -> None:
    if cp.shard_io:  # each rank holds its own frames: learn the others' counts
        got = torch.empty(cp.world, dtype=torch.int64, device=comm_device(cp.group))
        all_gather_single(got, torch.tensor([frames_here], device=got.device), group=cp.group)
        sizes = got.tolist()
    else:
        # Every rank must pass the same whole latents: agree on their shape once per forward,
        # so the attention layers can skip their own agreement (the ring takes `lens`).
        shapes = agree(cp.group, seq_dim=0, latents=latents)["latents"]
        require(len(set(shapes)) == 1, f"every rank must pass the same whole latents under CP "
                f"(shard_io=False): got shapes {shapes} on ranks 0..{cp.world - 1}")
        sizes = shard_sizes(frames_here, cp.world)
    if cp.split == "tokens":
        cp.lens = video_shard_sizes(frames_here, per_frame, cp.world, "tokens")
        require(min(cp.lens) >= 1, f"CP over {cp.world} ranks splits the {sum(cp.lens)} video "
                "tokens: give more tokens, or use fewer ranks")
        cp.frame_sizes, cp.per_frame = [], per_frame
    else:
        if min(sizes) < 1:
            raise InputError(
                f"CP over {cp.world} ranks splits the latent frames (after patchify), and there "
                f"are only {sum(sizes)}: give at least {cp.world} latent frames, use fewer "
                "ranks, or split='tokens'")
        cp.frame_sizes, cp.per_frame = sizes, per_frame
        cp.lens = [n * per_frame for n in sizes]  # = video_shard_sizes(..., "frames")
    cp.tok0 = shard_offsets(cp.lens)[cp.rank]
    g0 = cp.ring_rank * cp.ulysses
    cp.u_lens = cp.lens[g0:g0 + cp.ulysses]


def split_pre_forward(cp, params: list[str]):
    """`params`: the forward's parameter names in order (found once, not at every call)."""
    def hook(model, args, kwargs):
        args, kwargs = list(args), dict(kwargs)

        def get(name):
            i = params.index(name)
            return args[i] if i < len(args) else kwargs.get(name)

        def put(name, value):
            i = params.index(name)
            if i < len(args):
                args[i] = value
            else:
                kwargs[name] = value

        latents = get("hidden_states")
        frames, pph, ppw = latent_grid(model, latents)
        _split(cp, frames, pph * ppw, latents)
        mine, total = cp.lens[cp.rank], sum(cp.lens)
        t = get("timestep")
        if isinstance(t, torch.Tensor) and t.dim() == 2:  # one timestep per token (Wan 2.2)
            require(t.shape[1] in (total, mine), f"per-token timesteps must have one entry per"
                    f" video token ({total}, or this rank's {mine}), got {t.shape[1]}")
            if t.shape[1] == total and total != mine:
                put("timestep", t.narrow(1, cp.tok0, mine))  # [B, L] -> [B, L_r]
        rot = get("image_rotary_emb") if "image_rotary_emb" in params else None
        if rot is not None:  # CogVideoX: the pipeline passes the whole video's table
            n = rot[0].shape[0]
            require(n in (total, mine), f"image_rotary_emb must have one row per video token "
                    f"({total}, or this rank's {mine}), got {n}")
            if n == total and total != mine:  # ([L, D_rot], [L, D_rot]) -> L_r rows each
                put("image_rotary_emb", slice_tokens(rot, cp.tok0, mine, 0))
        return tuple(args), kwargs
    return hook


def split_tokens(cp):
    def hook(module, args, kwargs):
        if args:  # hidden states [B, L, C] -> this rank's [B, L_r, C]
            x = args[0]
            return (x.narrow(1, cp.tok0, cp.lens[cp.rank]),) + tuple(args[1:]), kwargs
        x = kwargs["hidden_states"]  # the same [B, L, C] -> [B, L_r, C], passed by name
        return args, {**kwargs, "hidden_states": x.narrow(1, cp.tok0, cp.lens[cp.rank])}
    return hook


def gather_hook(cp):
    def hook(module, args, output):
        return gather_uneven(output, cp.lens, dim=1, group=cp.group)  # [B, L_r, C] -> [B, L, C]
    return hook
