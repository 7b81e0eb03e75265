"""The calculator subcommands of `cpcourse`: tokens, memory, comm, plan.

    cpcourse tokens --height 720 --width 1280 --fps 24 --seconds 5 --json
    cpcourse tokens --list

Each returns (JSON-ready dict, human text). Token options are shared: `--model ID` for a preset,
or `--vae-temporal/--vae-spatial/--patch` by hand; size from `--frames` or `--fps --seconds`.
"""

from __future__ import annotations

import argparse

from cpcourse.cli.plan_cmd import (  # noqa: F401 (re-exported: tests read them here)
    PLAN_FLAGS,
    add_plan_args,
    plan_cmd,
    plan_conditions,
)
from cpcourse.planner import costs, tokens
from cpcourse.support.errors import InputError


def _gb(x: float) -> str:
    return f"{x / 1e9:,.2f} GB"


def _add_video(p: argparse.ArgumentParser, *, need_size: bool) -> None:
    p.add_argument("--model", help="preset id (see `cpcourse tokens --list`)")
    p.add_argument("--height", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--frames", type=int, help="pixel frames (or --fps and --seconds)")
    p.add_argument("--fps", type=float)
    p.add_argument("--seconds", type=float)
    p.add_argument("--vae-temporal", type=int, default=1,
                   help="temporal compression N; N > 1 means T = (F-1)//N + 1 (default 1)")
    p.add_argument("--vae-spatial", type=int, default=8, help="spatial compression (default 8)")
    p.add_argument("--patch", default="1,2,2", help="DiT patch T,H,W (default 1,2,2)")
    p.add_argument("--text-tokens", type=int, default=0,
                   help="manual mode: text tokens that join the attention sequence")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_parsers(sub) -> None:
    t = sub.add_parser("tokens", help="video -> latent grid -> tokens")
    _add_video(t, need_size=True)
    t.add_argument("--list", action="store_true", help="list the model presets")

    m = sub.add_parser("memory", help="attention, Q/K/V and activation memory, per GPU under CP")
    _add_video(m, need_size=False)
    m.add_argument("--tokens", type=int, help="sequence length (instead of the video options)")
    m.add_argument("--hidden", type=int)
    m.add_argument("--heads", type=int)
    m.add_argument("--ffn", type=int, help="MLP width (default 4 x hidden or the model's)")
    m.add_argument("--params-b", type=float, help="parameters in billions (weights per GPU)")
    m.add_argument("--dtype", default="bf16")
    m.add_argument("--cp", type=int, default=1)
    m.add_argument("--cfg-batch", type=int, default=1, help="2 when cond+uncond run batched")

    c = sub.add_parser("comm", help="ring / Ulysses / all-gather traffic and overlap")
    _add_video(c, need_size=False)
    c.add_argument("--tokens", type=int)
    c.add_argument("--cp", type=int, required=True)
    c.add_argument("--heads", type=int)
    c.add_argument("--head-dim", type=int)
    c.add_argument("--dtype", default="bf16")
    c.add_argument("--link",
                   help="nvlink3, nvlink4, nvlink5, pcie4, pcie4-host, pcie5, ib-ndr, ib-hdr")
    c.add_argument("--bandwidth", type=float, help="GB/s per direction (instead of --link)")
    c.add_argument("--link-efficiency", type=float)
    c.add_argument("--gpu", default="h100")
    c.add_argument("--attn-efficiency", type=float)
    c.add_argument("--layers", type=int)

    add_plan_args(sub.add_parser("plan", help="recommend a CP x TP x CFG layout for a model"))


def _video(args) -> tokens.TokenCount | None:
    """The token count the video options describe, or None when none were given."""
    if args.frames is not None and (args.fps is not None or args.seconds is not None):
        raise InputError("give --frames, or --fps with --seconds, not both (they can disagree)")
    if args.model:
        if args.frames is None and args.seconds is None and args.fps is not None:
            raise InputError("--fps needs --seconds too")
        return tokens.model_tokens(args.model, args.height, args.width, args.frames,
                                   fps=args.fps, seconds=args.seconds)
    if args.height is None and args.width is None:
        return None
    if args.height is None or args.width is None:
        raise InputError("give both --height and --width (or --model ID)")
    patch = tokens.parse_patch(args.patch)
    frames = args.frames
    if frames is None:
        if args.fps is None or args.seconds is None:
            raise InputError("give --frames, or both --fps and --seconds")
        rule = (tokens.FrameRule("causal", args.vae_temporal, 1) if args.vae_temporal > 1
                else tokens.FrameRule("none"))
        frames = tokens.frames_for_clip(args.fps, args.seconds, rule)
    return tokens.video_tokens(args.height, args.width, frames, vae_temporal=args.vae_temporal,
                               vae_spatial=args.vae_spatial, patch=patch,
                               text_tokens=args.text_tokens, text_joint=args.text_tokens > 0)


def _tokens_cmd(args):
    if args.list:
        rows = {k: {"name": m.name, "default": [m.default_height, m.default_width,
                                                 m.default_frames],
                    "frame_rule": m.rule.describe(), "text_joint": m.text_joint}
                for k, m in tokens.presets().items()}
        text = "\n".join(f"{k:28s} {v['name']}" for k, v in rows.items())
        return {"models": rows}, text
    t = _video(args)
    if t is None:
        raise InputError("give --model ID, or --height and --width with --frames "
                         "(or --fps and --seconds)")
    d = t.as_dict()
    text = (f"{t.frames} frames of {t.height}x{t.width} -> latent {t.latent_frames}x"
            f"{t.latent_height}x{t.latent_width} ({t.frame_rule}) -> {t.token_frames} x "
            f"{t.tokens_per_frame:,} = {t.video_tokens:,} video tokens; sequence "
            f"{t.sequence_length:,}")
    return d, text


def _model_dims(args) -> None:
    """Fill --hidden/--heads/... from --model when they were not given."""
    if args.model:
        m = tokens.get_model(args.model)
        for key, val in (("hidden", m.hidden), ("heads", m.heads), ("ffn", m.ffn),
                         ("params_b", m.params_b), ("head_dim", m.head_dim),
                         ("layers", m.layers)):
            if getattr(args, key, "absent") is None:
                setattr(args, key, val)


def _seq(args) -> int:
    t = _video(args)
    if args.tokens is not None and t is not None:
        raise InputError("give --tokens or the video options, not both")
    if args.tokens is None and t is None:
        raise InputError("give --tokens N, or a video (--model ID or --height/--width/--frames)")
    return args.tokens if t is None else t.sequence_length


def _memory_cmd(args):
    n = _seq(args)
    _model_dims(args)
    if args.hidden is None or args.heads is None:
        raise InputError("give --hidden and --heads (or --model ID)")
    d = costs.memory(n, args.hidden, args.heads, dtype=args.dtype, cp=args.cp, ffn=args.ffn,
                     params_b=args.params_b, cfg_batch=args.cfg_batch)
    text = (f"{n:,} tokens, hidden {args.hidden}, {args.heads} heads, {args.dtype}:\n"
            f"  attention matrix per head {_gb(d['attention_matrix_bytes_per_head'])} "
            f"(never materialised by fused kernels)\n"
            f"  Q/K/V per layer {_gb(d['qkv_bytes'])}; MLP intermediate "
            f"{_gb(d['mlp_intermediate_bytes'])}\n"
            f"  CP={args.cp}: {d['tokens_per_rank']:,} tokens per rank, Q/K/V "
            f"{_gb(d['qkv_bytes_per_rank'])}, activations "
            f"{_gb(d['activation_bytes_per_layer_per_rank'])}")
    if "per_gpu_bytes" in d:
        text += f"\n  per GPU with weights: {_gb(d['per_gpu_bytes'])}"
    return d, text


def _comm_cmd(args):
    n = _seq(args)
    _model_dims(args)
    if args.heads is None or args.head_dim is None:
        raise InputError("give --heads and --head-dim (or --model ID)")
    d = costs.comm(n, args.cp, args.heads, args.head_dim, dtype=args.dtype, link=args.link,
                   bandwidth_gbps=args.bandwidth, link_efficiency=args.link_efficiency,
                   gpu=args.gpu, attention_efficiency=args.attn_efficiency,
                   layers=1 if args.layers is None else args.layers)
    text = (f"ring of {args.cp}: {d['tokens_per_rank']:,} tokens per rank, {d['ring_hops']} hops"
            f" per layer\n  K/V per hop {_gb(d['kv_bytes_per_hop'])} "
            f"({d['kv_bytes_per_hop_per_head'] / 1e6:,.1f} MB per head), per layer "
            f"{_gb(d['kv_bytes_total'])}\n  per hop {d['comm_seconds_per_hop'] * 1e3:.2f} ms at "
            f"{d['effective_GBps']:.0f} GB/s vs {d['compute_seconds_per_step'] * 1e3:.2f} ms "
            f"compute per step at {d['effective_tflops']:.0f} TFLOP/s -> "
            f"{'hidden' if d['hidden'] else 'NOT hidden'}\n  hides above "
            f"{d['min_tokens_per_rank_to_hide']:,} tokens per rank; Ulysses moves "
            f"{_gb(d['ulysses_bytes_per_rank'])} per rank per layer")
    return d, text


def run(args) -> tuple[dict, str]:
    return {"tokens": _tokens_cmd, "memory": _memory_cmd, "comm": _comm_cmd,
            "plan": plan_cmd}[args.command](args)
