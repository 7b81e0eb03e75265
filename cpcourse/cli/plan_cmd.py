"""The `cpcourse plan` subcommand: one plan, the throughput answer, or the validation tables.

    cpcourse plan --model hunyuanvideo-13b --height 720 --width 1280 --frames 129 --gpus 8
    cpcourse plan --validate

`add_plan_args` gives the flags (`PLAN_FLAGS` names the mode each acts in, refused elsewhere),
`plan_cmd` answers them as (JSON-ready dict, human text), with the planner's track record on the
published runs nearest to the plan (`cpcourse.planner.validation.track_record`).
"""

from __future__ import annotations

import argparse

from cpcourse.planner import plan, throughput, validation
from cpcourse.planner.text_encoder import PLACES
from cpcourse.support.errors import InputError
from cpcourse.support.modes import ALWAYS, refuse_inactive
from cpcourse.viz.fmt import plural


def add_plan_args(p: argparse.ArgumentParser) -> None:
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


def validate_cmd(args):
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
                  + serial_text(v["serial_implied_s"], v["serial_model_s"])
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


def plan_cmd(args):
    parser = argparse.ArgumentParser(prog="cpcourse plan")
    add_plan_args(parser)
    refuse_inactive(parser, args, PLAN_FLAGS, plan_conditions(args))
    if args.validate:
        return validate_cmd(args)
    if args.model is None or args.gpus is None:
        raise InputError("plan needs --model ID and --gpus N (or --validate)")
    if args.parallel_vae and args.gpus == 1:
        raise InputError("--parallel-vae has no effect with --gpus 1: one GPU decodes whole")
    if args.objective == "throughput":
        return throughput_cmd(args)
    d = plan.plan(args.model, args.height, args.width, args.frames, args.gpus, args.gpu,
                  args.nodes, steps=args.steps, kernel=args.kernel, layout=args.layout,
                  fsdp=args.fsdp, released=args.released, offload=args.offload,
                  text_encoder_cpu=args.text_encoder_cpu, text_encoder=args.text_encoder,
                  parallel_vae=args.parallel_vae).as_dict()
    d["objective"] = "latency"
    if not d["valid"]:
        return d, f"{d['model']}: layout {args.layout} is not valid: {d['reason']}"
    text = (f"{d['model']} on {d['gpus']} x {d['gpu']} ({plural(d['nodes'], 'node')}): "
            f"{plan.Layout(**d['layout'])}, {d['per_gpu_bytes'] / 1e9:,.2f} GB per GPU "
            f"({'fits' if d['fits'] else 'does NOT fit'}), {d['seconds_per_step']:.2f} s per "
            f"step, {d['seconds_total']:.0f} s for {d['steps']} steps and the fixed costs "
            f"(model; {d['seconds_total_interval'][0]:.0f}-{d['seconds_total_interval'][1]:.0f} s "
            "with every uncertain input at either end)\n"
            + "\n".join(f"  - {r}" for r in d["reasoning"]))
    for r in d.get("runners_up", []):
        text += (f"\n  runner-up {plan.Layout(**r['layout'])}: {r['seconds_total']:.0f} s "
                 f"({r['why_not']})")
    d["track_record"] = validation.track_record(d["model"], d["gpu"])
    return d, text + "\n" + track_text(d["track_record"])


def throughput_cmd(args):
    d = throughput.throughput(args.model, args.height, args.width, args.frames, args.gpus,
                              args.gpu, args.nodes, max_seconds=args.max_seconds,
                              steps=args.steps, kernel=args.kernel, fsdp=args.fsdp,
                              released=args.released, offload=args.offload,
                              text_encoder_cpu=args.text_encoder_cpu,
                              text_encoder=args.text_encoder, parallel_vae=args.parallel_vae)
    text = (f"{d['model']} on {d['gpus']} x {d['gpu']}, for throughput:\n"
            + "\n".join(f"  - {r}" for r in d["reasoning"]))
    d["track_record"] = validation.track_record(d["model"], d["gpu"])
    return d, text + "\n" + track_text(d["track_record"])


def serial_text(implied_s: float, model_s: float) -> str:
    return (f"what did not shrink with the GPUs: {implied_s:.0f} s by the runs, {model_s:.0f} s "
            "of fixed costs in the model")


def track_text(t: dict) -> str:
    """How far off the model was on the nearest published runs: a line, and one per table."""
    if not t["runs"]:
        return ("Track record: no published run of this model to check the planner against; "
                "treat the times as unvalidated")
    lines = [f"Track record ({t['scope']}, {t['runs']} published runs): predicted / "
             f"published {t['ratio_min']:.2f} to {t['ratio_max']:.2f}"]
    lines += [f"  {name}: {v['gpus'][0]} -> {v['gpus'][1]} GPUs {v['published']:.2f}x "
              f"published, {v['predicted']:.2f}x predicted; "
              + serial_text(t["serial"][name]["implied_s"], t["serial"][name]["model_s"])
              for name, v in t["speedups"].items()]
    return "\n".join(lines)
