"""The calculator subcommands of `cpcourse`: tokens, memory, comm, plan.

    cpcourse tokens --height 720 --width 1280 --fps 24 --seconds 5 --json
    cpcourse tokens --list

Each returns (JSON-ready dict, human text). Token options are shared: `--model ID` for a preset,
or `--vae-temporal/--vae-spatial/--patch` by hand; size from `--frames` or `--fps --seconds`.
"""

from __future__ import annotations

import argparse

from cpcourse.planner import costs, plan, throughput, tokens, validation
from cpcourse.planner.text_encoder import PLACES
from cpcourse.support.errors import InputError
from cpcourse.support.modes import ALWAYS, refuse_inactive
from cpcourse.viz.fmt import plural


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

    _add_plan_args(sub.add_parser("plan", help="recommend a CP x TP x CFG layout for a model"))


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model")
    p.add_argument("--height", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--frames", type=int)
    p.add_argument("--gpus", type=int)
    p.add_argument("--gpu", default="h100")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--steps", type=int, help="denoising steps (default 50)")
    p.add_argument("--kernel", default="auto", help="attention kernel: auto, fa2, fa3, sdpa")
    p.add_argument("--layout", help="cost this layout, e.g. cfg=2,ulysses=4,ring=1,tp=1")
    p.add_argument("--fsdp", action="store_true",
                   help="transformer and text encoder FSDP-sharded over all GPUs")
    p.add_argument("--released", action="store_true",
                   help="the released code's dtypes (Wan: float32 transformer and VAE decode)")
    p.add_argument("--offload", action="store_true",
                   help="text encoder on the GPU only to encode, transformer off it before the "
                        "decode (Wan's --offload_model)")
    p.add_argument("--text-encoder-cpu", action="store_true",
                   help="run the text encoder on the CPU (Wan's --t5_cpu; as --text-encoder cpu)")
    p.add_argument("--text-encoder", choices=PLACES,
                   help="where the text encoder lives: resident (on every GPU throughout, the "
                        "default), freed (after encoding), cpu, own-gpu (a GPU of its own)")
    p.add_argument("--parallel-vae", action="store_true",
                   help="split the VAE decode over the GPUs by height, with halo rows "
                        "(default: it runs whole on one GPU)")
    p.add_argument("--validate", action="store_true",
                   help="predict every published run in the facts and report the errors")
    p.add_argument("--objective", choices=("latency", "throughput"), default="latency",
                   help="latency: one video soonest (default); throughput: most videos an hour, "
                        "CP on all GPUs against independent replicas")
    p.add_argument("--max-seconds", type=float,
                   help="throughput: a latency target per video that the answer must meet")
    p.add_argument("--json", action="store_true")


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


def _validate_cmd(args):
    d = validation.validate()
    lines = []
    second = ("xDiT's 960x960 table (not held out: same page, GPUs and code as the 720p "
              "table, read before the planner's last changes)")
    added = ("runs added after the planner was built (held out: none read before its last "
             "change)" if d["added"]["held_out"] else "runs added after the planner was built")
    for title, part in (("validation set", d), (second, d["holdout"]), (added, d["added"])):
        lines += [title + ":", f"{'table':28s} {'GPUs':>4}  {'published s':>11}  "
                  f"{'predicted s':>11}  ratio  interval s"]
        lines += [f"{r['table']:28s} {r['gpus']:>4}  {r['published_s']:11.1f}  "
                  f"{r['predicted_s']:11.1f}  {r['ratio']:5.2f}  "
                  f"[{r['interval_s'][0]:.0f}, {r['interval_s'][1]:.0f}]"
                  + ("" if r["covered"] else " outside")
                  + ("" if r["layout_sourced"] else
                     f"  * layout not given: fastest {plan.Layout(**r['layout'])}, "
                     f"{r['predicted_range_s'][0]:.1f}-{r['predicted_range_s'][1]:.1f} s")
                  for r in part["rows"]]
        lines.append(f"median |predicted / published - 1| = {part['median_abs_rel_error']:.1%}, "
                     f"worst {part['worst_abs_rel_error']:.1%}; published time inside the "
                     f"interval in {part['interval_coverage']:.0%} of runs")
        mem = [r for r in part["rows"] if r["memory_ratio"]]
        if mem:
            lines += ["peak memory per GPU, where published (GB):",
                      f"{'table':28s} {'GPUs':>4}  {'published':>9}  {'predicted':>9}  ratio"]
            lines += [f"{r['table']:28s} {r['gpus']:>4}  {r['published_peak_bytes'] / 1e9:9.1f}"
                      f"  {r['predicted_peak_bytes'] / 1e9:9.1f}  {r['memory_ratio']:5.2f}"
                      for r in mem]
            lines.append(f"median |predicted / published - 1| = "
                         f"{part['memory']['median_abs_rel_error']:.1%}, worst "
                         f"{part['memory']['worst_abs_rel_error']:.1%}")
        lines += [f"  {name}: speedup {v['gpus'][0]} -> {v['gpus'][1]} GPUs published "
                  f"{v['published']:.2f}x, predicted {v['predicted']:.2f}x; "
                  + _serial_text(v["serial_implied_s"], v["serial_model_s"])
                  for name, v in part["speedups"].items()]
    lines += ["", "leave-one-source-out (every run of a source predicted with nothing read from "
              "it):"]
    lines += [f"  {sid}: {s['runs']} runs, median {s['median_abs_rel_error']:.1%}, worst "
              f"{s['worst_abs_rel_error']:.1%} ({s['worst_run']}), signed median "
              f"{s['signed_median']:+.1%}, interval coverage {s['interval_coverage']:.0%}"
              for sid, s in d["by_source"].items()]
    lines.append("  " + d["leave_one_source_out"])
    return d, "\n".join(lines)


# Each `plan` flag with the mode it acts in (`cpcourse.support.modes`). Whether a model has
# released dtypes for --released to use is the planner's own check (`plan.plan`).
PLAN_FLAGS = {"validate": ALWAYS, "json": ALWAYS, "layout": "latency",
              "max_seconds": "throughput", **{
    dest: "one_plan" for dest in ("model", "height", "width", "frames", "gpus", "gpu", "nodes",
                                  "steps", "kernel", "fsdp", "released", "offload",
                                  "text_encoder_cpu", "text_encoder", "parallel_vae",
                                  "objective")}}


def plan_conditions(args) -> dict[str, tuple[bool, str]]:
    """Which of PLAN_FLAGS' conditions these arguments meet, and what each needs."""
    one = not args.validate
    return {"one_plan": (one, "no --validate (it predicts the published runs as they were "
                         "made)"),
            "latency": (one and args.objective == "latency", "--objective latency (throughput "
                        "compares the layouts itself) and no --validate"),
            "throughput": (one and args.objective == "throughput",
                           "--objective throughput and no --validate")}


def _plan_cmd(args):
    parser = argparse.ArgumentParser(prog="cpcourse plan")
    _add_plan_args(parser)
    refuse_inactive(parser, args, PLAN_FLAGS, plan_conditions(args))
    if args.validate:
        return _validate_cmd(args)
    if args.model is None or args.gpus is None:
        raise InputError("plan needs --model ID and --gpus N (or --validate)")
    if args.parallel_vae and args.gpus == 1:
        raise InputError("--parallel-vae has no effect with --gpus 1: one GPU decodes whole")
    if args.objective == "throughput":
        return _throughput_cmd(args)
    d = plan.plan(args.model, args.height, args.width, args.frames, args.gpus, args.gpu,
                  args.nodes, steps=args.steps, kernel=args.kernel, layout=args.layout,
                  fsdp=args.fsdp, released=args.released, offload=args.offload,
                  text_encoder_cpu=args.text_encoder_cpu, text_encoder=args.text_encoder,
                  parallel_vae=args.parallel_vae).as_dict()
    d["objective"] = "latency"
    if not d["valid"]:
        return d, f"{d['model']}: layout {args.layout} is not valid: {d['reason']}"
    text = (f"{d['model']} on {d['gpus']} x {d['gpu']} ({plural(d['nodes'], 'node')}): "
            f"{plan.Layout(**d['layout'])}, {_gb(d['per_gpu_bytes'])} per GPU "
            f"({'fits' if d['fits'] else 'does NOT fit'}), {d['seconds_per_step']:.2f} s per "
            f"step, {d['seconds_total']:.0f} s for {d['steps']} steps and the fixed costs "
            f"(model; {d['seconds_total_interval'][0]:.0f}-{d['seconds_total_interval'][1]:.0f} s "
            "with every uncertain input at either end)\n"
            + "\n".join(f"  - {r}" for r in d["reasoning"]))
    for r in d.get("runners_up", []):
        text += (f"\n  runner-up {plan.Layout(**r['layout'])}: {r['seconds_total']:.0f} s "
                 f"({r['why_not']})")
    d["track_record"] = validation.track_record(d["model"], d["gpu"])
    return d, text + "\n" + _track_text(d["track_record"])


def _throughput_cmd(args):
    d = throughput.throughput(args.model, args.height, args.width, args.frames, args.gpus,
                              args.gpu, args.nodes, max_seconds=args.max_seconds,
                              steps=args.steps, kernel=args.kernel, fsdp=args.fsdp,
                              released=args.released, offload=args.offload,
                              text_encoder_cpu=args.text_encoder_cpu,
                              text_encoder=args.text_encoder, parallel_vae=args.parallel_vae)
    text = (f"{d['model']} on {d['gpus']} x {d['gpu']}, for throughput:\n"
            + "\n".join(f"  - {r}" for r in d["reasoning"]))
    d["track_record"] = validation.track_record(d["model"], d["gpu"])
    return d, text + "\n" + _track_text(d["track_record"])


def _serial_text(implied_s: float, model_s: float) -> str:
    return (f"what did not shrink with the GPUs: {implied_s:.0f} s by the runs, {model_s:.0f} s "
            "of fixed costs in the model")


def _track_text(t: dict) -> str:
    """How far off the model was on the nearest published runs: a line, and one per table."""
    if not t["runs"]:
        return ("Track record: no published run of this model to check the planner against; "
                "treat the times as unvalidated")
    lines = [f"Track record ({t['scope']}, {t['runs']} published runs): predicted / "
             f"published {t['ratio_min']:.2f} to {t['ratio_max']:.2f}"]
    lines += [f"  {name}: {v['gpus'][0]} -> {v['gpus'][1]} GPUs {v['published']:.2f}x "
              f"published, {v['predicted']:.2f}x predicted; "
              + _serial_text(t["serial"][name]["implied_s"], t["serial"][name]["model_s"])
              for name, v in t["speedups"].items()]
    return "\n".join(lines)


def run(args) -> tuple[dict, str]:
    return {"tokens": _tokens_cmd, "memory": _memory_cmd, "comm": _comm_cmd,
            "plan": _plan_cmd}[args.command](args)
