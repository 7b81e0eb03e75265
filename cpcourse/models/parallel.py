"""`parallelize(model)`: a diffusers video transformer runs under CP in place, forward untouched.

    python -m cpcourse.cli models --arch wan --nproc 3 --method ring --compare --json

Every rank calls the model exactly as one process would, with the full inputs, and gets the full
output. Five torch hooks and one attention processor per attention module do the rest:

    1. model pre-hook   reads the latent grid, splits the LATENT FRAMES over the ranks
                        (tensor_split: uneven is fine, fewer frames than ranks is refused;
                        split="tokens" splits the flattened tokens evenly instead), slices
                        per-token timesteps (Wan 2.2) and a passed-in rotary table (CogVideoX)
                        to this rank's tokens
    2. rotary hook      replaces the model's table by its shard's rows, at the shard's GLOBAL
                        offset (Wan, HunyuanVideo: `cpcourse.models.rotary`)
    3. first-block hook splits the video tokens, after patch embedding: the patchify and the
                        text/time embeddings ran on the full input and are the same everywhere
    4. processors       the softmax over the whole video (`cpcourse.models.processors`)
    5. proj_out hook    all-gathers the tokens again (padded: shards may differ by a frame),
                        so the model's own unpatchify sees the whole video
Text tokens are never split: cross-attention (Wan) reads the replicated text locally, joined text
(HunyuanVideo, CogVideoX) enters the softmax once. With `shard_io=True` the model instead takes
and returns this rank's frames only (`cpcourse.models.shards`): hooks 3 and 5 are off and a
sampler gathers once, at the end. Hooks 1, 3 and 5 live in `cpcourse.models.split`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch.distributed as dist

from cpcourse.models.build import arch_of
from cpcourse.models.processors import PROCESSORS, cp_attention_modules
from cpcourse.models.rotary import hunyuan_rope_shard, slice_tokens, wan_rope_shard
from cpcourse.models.split import (
    SPLITS,
    gather_hook,
    split_pre_forward,
    split_tokens,
)
from cpcourse.ring import MODES as RING_MODES
from cpcourse.support.errors import InputError, require
from cpcourse.support.groups import (
    agree_settings,
    require_group,
)
from cpcourse.support.layout import divisors

METHODS = ("ring", "ulysses", "usp", "allgather")


def check_ulysses(heads: int, ulysses: int, world: int, what: str = "the model's") -> None:
    """InputError unless `ulysses` divides the heads, naming the degrees that would work."""
    if heads % ulysses:
        works = [d for d in divisors(heads) if d <= world and world % d == 0]
        raise InputError(
            f"Ulysses splits {what} {heads} heads over {ulysses} ranks, which does not divide "
            f"them: Ulysses degrees that work on {world} ranks are {', '.join(map(str, works))} "
            f"(method 'usp' with ulysses = one of those); the ring has no such limit")


@dataclass
class CPState:
    """What the hooks and processors share: groups, the method, this forward's split."""
    method: str
    group: object
    rank: int
    world: int
    ulysses: int = 1  # ranks per Ulysses group (usp / ulysses)
    ring: int = 1  # Ulysses groups the ring runs across
    u_group: object = None
    u_rank: int = 0
    ring_group: object = None
    ring_rank: int = 0
    ring_mode: str = "overlap"
    shard_io: bool = False
    split: str = "frames"  # "frames" | "tokens": `cpcourse.models.split`
    mesh: object = None  # a cpcourse.mesh DeviceMesh, when parallelized on one
    handles: list = field(default_factory=list)
    # set by the model pre-hook for each forward
    frame_sizes: list = field(default_factory=list)  # latent frames (after patchify) per rank
    per_frame: int = 0  # tokens per latent frame
    lens: list = field(default_factory=list)  # video tokens per rank
    tok0: int = 0  # this rank's first token
    u_lens: list = field(default_factory=list)  # video tokens of my Ulysses group's ranks

    @property
    def f0(self) -> int:
        """The latent frame this rank's first token is in (its first frame under a frame split)."""
        return self.tok0 // self.per_frame if self.per_frame else 0


def _groups(cp: CPState, heads: int, ulysses: int | None) -> None:
    """Ulysses groups of neighbouring ranks, ring groups across them (usp builds both)."""
    if cp.method == "ulysses":
        ulysses = cp.world
    elif cp.method == "usp":
        if ulysses is None:  # the largest head split that fits: Ulysses is cheaper inside a node
            ulysses = max(d for d in divisors(cp.world) if heads % d == 0)
        require(isinstance(ulysses, int) and ulysses >= 1 and cp.world % ulysses == 0,
                f"usp needs a Ulysses degree that divides the {cp.world} ranks: choose one of "
                f"{', '.join(map(str, divisors(cp.world)))}, got {ulysses!r}")
    else:
        ulysses = 1
    check_ulysses(heads, ulysses, cp.world)
    cp.ulysses, cp.ring = ulysses, cp.world // ulysses
    cp.u_rank, cp.ring_rank = cp.rank % ulysses, cp.rank // ulysses
    if cp.method in ("ring", "allgather"):
        cp.ring_group, cp.ring, cp.ulysses, cp.ring_rank, cp.u_rank = cp.group, cp.world, 1, \
            cp.rank, 0
        return
    if cp.ring == 1:
        cp.u_group = cp.group
        return
    require(cp.group is None or dist.get_world_size(cp.group) == dist.get_world_size(),
            "usp with a ring builds its own subgroups of the whole world: pass group=None")
    from cpcourse.mesh import make_mesh  # Ulysses on neighbouring ranks, the ring across them

    mesh = make_mesh(ring=cp.ring, ulysses=ulysses)
    cp.u_group, cp.ring_group = mesh.get_group("ulysses"), mesh.get_group("ring")


def rope_hook(cp: CPState, plan):
    """The rotary table of this rank's tokens: the rows of the frames its tokens touch, cut to
    its token range (a frame split's range is whole frames). `plan`: the arch's `CPPlan`."""
    def hook(module, args, output):
        n, per = cp.lens[cp.rank], cp.per_frame
        f0 = cp.tok0 // per
        nf = (cp.tok0 + n - 1) // per - f0 + 1
        latents = args[0]  # [B, C, F, H, W]
        patch = module.patch_size  # (t, h, w) for Wan, one int for HunyuanVideo
        ph, pw = (patch[1], patch[2]) if isinstance(patch, tuple | list) else (patch, patch)
        grid, gw = latents.shape[-2] // ph, latents.shape[-1] // pw
        # looked up at call time, so a test can plant a wrong shard (tests/dist/test_models_cp)
        shard = {"wan": wan_rope_shard, "hunyuan": hunyuan_rope_shard}[plan.rope]
        # Hunyuan computes its rows (on the latents' device); Wan slices the model's own tables
        extra = {"device": latents.device} if plan.rope_builds_rows else {}
        cos, sin = shard(module, f0, nf, grid, gw, **extra)  # the frames' rows: nf * per
        # -> this rank's n = L_r rows along the token dim (Wan [1, L_r, 1, D], Hunyuan [L_r, D])
        cos, sin = slice_tokens((cos, sin), cp.tok0 - f0 * per, n, plan.rope_token_dim)
        return cos.to(output[0].dtype), sin.to(output[1].dtype)
    return hook


def _mesh_state(mesh, model, heads: int, ring_mode: str, shard_io: bool) -> CPState:
    """CP over the mesh's ring x ulysses dims (USP); tensor parallel over its tp dim (Wan)."""
    from cpcourse.mesh import cp_coords, cp_group, layout_of
    from cpcourse.support.layout import check_layout

    lay = check_layout(layout_of(mesh), heads=heads)
    if lay.tp > 1:
        from cpcourse.models.tp import tensor_parallel_wan

        tensor_parallel_wan(model, mesh.get_group("tp"))
    rank, world = cp_coords(mesh)
    cp = CPState(method="usp" if lay.ulysses > 1 else "ring", group=cp_group(mesh), rank=rank,
                 world=world, ring_mode=ring_mode, shard_io=bool(shard_io), mesh=mesh)
    cp.ulysses, cp.ring = lay.ulysses, lay.ring
    cp.u_rank, cp.ring_rank = mesh.get_local_rank("ulysses"), mesh.get_local_rank("ring")
    cp.u_group, cp.ring_group = mesh.get_group("ulysses"), mesh.get_group("ring")
    return cp


def _agree_call(model, group, mesh, **args) -> None:
    """Before any other check or collective: every rank of the group passes the same method and
    settings and holds a model of the same shape, or all raise the same InputError (different
    methods timed out in a send, different head counts aborted a rank)."""
    from cpcourse.mesh import layout_of

    if not dist.is_initialized():  # no other rank to agree with: parallelize's checks say so
        return
    attn = cp_attention_modules(model)
    shape = {"attention layers": len(attn), "heads": attn[0].heads if attn else 0,
             "head dim": getattr(model.config, "attention_head_dim", None),
             "parameters": sum(p.numel() for p in model.parameters())}
    agree_settings(group, "parallelize", model=type(model).__name__, **shape, **args,
                   layout=None if mesh is None else str(layout_of(mesh)))
    require(attn, f"{type(model).__name__} has no attention block to split: build it with "
            "num_layers >= 1")


def parallelize(model, group=None, method: str | None = None, ulysses: int | None = None,
                ring_mode: str = "overlap", shard_io: bool = False, mesh=None,
                split: str = "frames"):
    """Run `model` (a diffusers Wan / HunyuanVideo / CogVideoX transformer) under CP, in place.

    Call on every rank of `group` (default: the world) after the process group is initialised.
    method: "ring" | "ulysses" | "usp" (Ulysses inside groups of `ulysses` neighbouring ranks,
    the ring across groups; default: the largest degree that divides the heads and the world) |
    "allgather". ring_mode: the ring's "overlap" or "blocking". shard_io: the model takes and
    returns this rank's latent frames (see `shard_latents`) instead of the whole video.
    mesh: a `cpcourse.mesh.make_mesh` DeviceMesh instead of group and method: the frames split
    over its ring x ulysses ranks (USP), Wan's heads over its tp ranks (`models/tp.py`); its cfg
    dim is the sampler's (`models.sampler.sample` runs one branch per cfg rank).
    split: "frames" (whole latent frames per rank) or "tokens" (the flattened video split
    evenly, as the planner assumes; not with shard_io): see `cpcourse.models.split`.
    Returns the model; `unparallelize(model)` undoes it (not tensor parallel: build afresh).
    """
    info = arch_of(model)
    _agree_call(model, group, method=method, ulysses=ulysses, ring_mode=ring_mode,
                shard_io=shard_io, mesh=mesh, split=split)
    require(split in SPLITS, f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    require(not (shard_io and split == "tokens"), "shard_io hands each rank whole latent frames "
            "(shard_latents): use split='frames' with it, or shard_io=False")
    if mesh is not None:
        require(group is None and method in (None, "usp") and ulysses is None,
                "with a mesh, the CP ranks are its ring x ulysses dims: pass no group, method "
                "or ulysses")
    method = method or ("usp" if mesh is not None else "ring")
    require(method in METHODS, f"method must be one of {', '.join(METHODS)}, got {method!r}")
    require(ring_mode in RING_MODES[:2], f"ring_mode must be 'overlap' or 'blocking', got "
            f"{ring_mode!r} (method='allgather' is the all-gather variant)")
    require(getattr(model, "_cpcourse", None) is None,
            "this model is already parallelized: call unparallelize(model) first")
    refusals = info.cp.refuse + (info.cp.refuse_shard_io if shard_io else ())
    for key, value, why in refusals:
        require(getattr(model.config, key, None) != value, why)
    rank, world = require_group(group, "parallelize")
    heads = cp_attention_modules(model)[0].heads
    if mesh is not None:
        cp = _mesh_state(mesh, model, heads, ring_mode, shard_io)
    else:
        cp = CPState(method=method, group=group, rank=rank, world=world,
                     ring_mode="allgather" if method == "allgather" else ring_mode,
                     shard_io=bool(shard_io))
        _groups(cp, heads, ulysses)
    hooks = cp.handles
    params = list(inspect.signature(type(model).forward).parameters)[1:]  # without self
    hooks.append(model.register_forward_pre_hook(split_pre_forward(cp, params), with_kwargs=True))
    if info.cp.rope is not None:
        hooks.append(model.rope.register_forward_hook(rope_hook(cp, info.cp)))
    if not shard_io:
        first = next(blocks for name in info.cp.first_blocks
                     if len(blocks := getattr(model, name)))[0]
        hooks.append(first.register_forward_pre_hook(split_tokens(cp), with_kwargs=True))
        hooks.append(model.proj_out.register_forward_hook(gather_hook(cp)))
    cls = PROCESSORS[info.cls]
    for attn in cp_attention_modules(model):
        attn.set_processor(cls(cp, attn.processor))
    cp.split = split
    model._cpcourse = cp
    return model


def unparallelize(model):
    """Undo `parallelize`: hooks removed, the model's own processors back. Returns the model."""
    cp = getattr(model, "_cpcourse", None)
    require(cp is not None, "this model is not parallelized")
    for h in cp.handles:
        h.remove()
    for attn in cp_attention_modules(model):
        attn.set_processor(attn.processor.original)
    model._cpcourse = None
    return model


def cp_state(model) -> CPState | None:
    return getattr(model, "_cpcourse", None)
