"""`cpcourse generate`: a clip from the trained tiny video model, on P processes under CP.

    cpcourse generate --prompt circle-right --seed 0 --nproc 2 --gif /tmp/circle.gif --compare

The sampler is Euler steps of a rectified flow (x_1 = noise, x_0 = sample) with classifier-free
guidance, the conditional and unconditional passes as one batch of 2B (`cpcourse.tinydit.sampling`).
Noise is drawn for the whole video from the seed on every rank and each rank keeps its frames, so
the clip does not depend on P; `--compare` also samples in this process and reports the largest
difference. Every rank measures its peak tensor memory and its time per step.

Weights: `--weights shipped` (the default) is the model `cpcourse train` trained on moving
shapes (`cpcourse.tinydit.moving_shapes`): `--prompt` picks what it draws (`--list-prompts`),
`--save` writes the clip `[T, 3, H, W]` in [0, 1] and `--gif` an animated GIF; the report says what
the tracker sees in the clip. `--weights FILE` takes a file `cpcourse train` wrote. `--weights
random` is the seeded random DiT of the exactness tests: `--label` conditions it, and `--save`
writes its latents `[B, C, T, Hl, Wl]`. A `.json` report is written beside every saved file.
`--causal` streams the chunk-causal model instead: chunk after chunk, the finished ones in a KV
cache laid out under CP as `--kv-cache` says. `--window W` samples a longer video from
overlapping windows. `--approx naive|displaced|pipefusion|asyncdiff` (with `--warmup`,
`--patches`, `--split`) and `--cache fbcache` sample by an approximate method instead,
`--compare` then against the exact clip; `--comm-dtype` sends attention's traffic in fp8/bf16.
Each mode's flags are the fields of its Request in `cpcourse.runs` (generate, long_video,
stream, approx, comm_generate), the files' flags those of `cpcourse.support.out_files.ClipFiles`
and the two that pick what runs those of `Selection`: this module builds the parser from them,
picks the mode, refuses a flag that cannot act in it, and writes the files; the Request runs.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from cpcourse.cli.progress import rank_lines, running
from cpcourse.runs.approx import ApproxRequest
from cpcourse.runs.comm_generate import CommRequest
from cpcourse.runs.generate import GenerateRequest
from cpcourse.runs.long_video import LongVideoRequest
from cpcourse.runs.stream import StreamRequest
from cpcourse.support.errors import InputError
from cpcourse.support.modes import given, refuse_inactive
from cpcourse.support.out_files import ClipFiles
from cpcourse.support.request import fields, flag
from cpcourse.support.request_flags import add_request_flags, mode_table, request_values
from cpcourse.support.tolerance import describe

ONE_CLIP = {f.name for f in fields(GenerateRequest)}  # the flags every kind of clip shares


@dataclass(frozen=True)
class Selection:
    """The flags that pick what `generate` does, not how a clip is made or written."""

    list_prompts: bool = flag(False, "print the prompt ids and stop")
    causal: bool = flag(False, "stream chunk after chunk from the chunk-causal model, with a "
                        "KV cache", acts="clips")


def build_parser() -> argparse.ArgumentParser:
    """The flags of one clip are GenerateRequest's fields (`cpcourse.support.request_flags`); the
    files' (ClipFiles) and the other modes' flags follow."""
    from cpcourse.support.errors import ArgumentParser

    p = ArgumentParser(prog="cpcourse generate", description=__doc__.split("\n")[0])
    add_request_flags(p, Selection, skip=("causal",))
    add_request_flags(p, GenerateRequest)
    add_request_flags(p, ClipFiles)
    # --window W: the flags of `cpcourse.runs.long_video.LongVideoRequest` (its fields)
    add_request_flags(p, LongVideoRequest, skip=ONE_CLIP, unset=True, selects=("window",))
    # --approx METHOD or --cache fbcache: the flags of `cpcourse.runs.approx.ApproxRequest`
    add_request_flags(p, ApproxRequest, skip=ONE_CLIP, unset=True, selects=("approx", "cache"))
    # --causal, then the flags of `cpcourse.runs.stream.StreamRequest` (its fields)
    add_request_flags(p, Selection, skip=("list_prompts",))
    add_request_flags(p, StreamRequest, skip=ONE_CLIP, unset=True)
    # --comm-dtype: the flags of `cpcourse.runs.comm_generate.CommRequest`
    add_request_flags(p, CommRequest, skip=ONE_CLIP, unset=True, selects=("comm_dtype",))
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


# Each flag with the mode it acts in (`cpcourse.support.modes`): one outside it is refused.
# Every field says its own (`acts`): the Requests', then the files' and the selection's.
MODE_FLAGS = mode_table(GenerateRequest) | {
    **mode_table(LongVideoRequest, skip=ONE_CLIP), **mode_table(ApproxRequest, skip=ONE_CLIP),
    **mode_table(CommRequest, skip=ONE_CLIP), **mode_table(StreamRequest, skip=ONE_CLIP),
    **mode_table(Selection, skip=("causal",)), **mode_table(ClipFiles),
    **mode_table(Selection, skip=("list_prompts",))}  # --causal after the files, as in --help


def mode_conditions(args: argparse.Namespace) -> dict[str, tuple[bool, str]]:
    """Which of MODE_FLAGS' conditions these arguments meet, and what each needs."""
    clips = not args.list_prompts
    plain = clips and not args.causal
    windows = plain and (args.window is not None or args.stride is not None)
    one_clip = plain and not windows
    random = args.weights == "random"
    return {"clips": (clips, "no --list-prompts (it prints the prompt ids and stops)"),
            "plain": (plain, "no --causal (the causal model streams its own 8 frames of "
                      "32 x 32, one chunk at a time)"),
            "causal": (clips and args.causal, "--causal (a clip streamed by the chunk-causal "
                       "model)"),
            "trained": (clips and not random, "trained weights, not --weights random (the "
                        "random model's latents are not pixels; it takes --label)"),
            "random": (clips and random, "--weights random (the trained model takes --prompt)"),
            "random_clip": (one_clip and random, "--weights random, no --window and no "
                            "--causal (trained weights fix their attention)"),
            "one_clip": (one_clip, "one bidirectional clip, no --window (windows take "
                         "--parallel windows|cp over --nproc ranks) and no --causal (its "
                         "cache takes --kv-cache)"),
            "plain_cp": (one_clip and args.layout is None, "plain CP: no --window, no "
                         "--causal and no --layout (under a layout attention runs USP over its "
                         "ring and ulysses dims)"),
            "windows": (windows and args.window is not None, "--window W (a long video from "
                        "overlapping windows)"),
            "approx": (clips and args.approx is not None, "--approx METHOD"),
            "approximate": (clips and (args.approx is not None or args.cache is not None),
                            "--approx METHOD or --cache fbcache"),
            "pipefusion": (clips and args.approx == "pipefusion", "--approx pipefusion"),
            "cache": (clips and args.cache is not None, "--cache fbcache"),
            "writes": (clips and (args.save is not None or args.gif is not None),
                       "--save or --gif (a file it may replace)"),
            "comm": (one_clip and not random and args.layout is None and args.approx is None
                     and args.cache is None, "one exact clip of the trained model: no "
                     "--weights random, --window, --causal, --layout, --approx or --cache")}


def main(argv: list[str]) -> int:
    from cpcourse.tinydit.moving_shapes import PROMPTS

    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_inactive(parser, args, MODE_FLAGS, mode_conditions(args))
    if args.list_prompts:
        print(json.dumps({"prompts": list(PROMPTS)}) if args.json else "\n".join(PROMPTS))
        return 0
    if args.causal and (args.approx is not None or args.cache is not None):
        parser.error("--causal streams the chunk-causal model exactly; --approx and --cache "
                     "sample the bidirectional one approximately: choose one")
    if args.causal:
        return main_causal(args)
    if args.approx is not None or args.cache is not None:
        return main_approx(parser, args)
    if args.window is not None:
        return main_long(args)
    if args.comm_dtype is not None:
        return main_comm(parser, args)
    return main_one_clip(args)


def main_one_clip(args: argparse.Namespace) -> int:
    """One clip by exact CP: the Request (checked), the --compare-to file, the run, the files."""
    from cpcourse.runs.generate import run

    files = ClipFiles(**request_values(ClipFiles, args))  # checked before any start
    other = files.load_compare()
    req = GenerateRequest(**request_values(GenerateRequest, args))
    files.check_compare(other, req.output_shape)  # the run's shape is known before it starts
    what = (f"{req.prompt or 'the random model'}, {req.steps} denoising steps"
            + (", then one process to compare" if req.compare else ""))
    with running(req.nproc, what):
        res = run(req, stream=rank_lines if args.json else True)
    out = res["clip"] if res["clip"] is not None else res["latents"]
    if other is not None:
        res["report"]["max_abs_diff_vs_compare"] = float((other - out).abs().max())
    return finish(args, files, res, out, lambda report: _print_report(args, report, req.layout))


def main_long(args: argparse.Namespace) -> int:
    """`--window W`: a video longer than the model's window, from overlapping windows."""
    from cpcourse.runs.long_video import print_report, run

    files = ClipFiles(**request_values(ClipFiles, args))
    req = LongVideoRequest(**request_values(LongVideoRequest, args))  # every refusal first
    with running(req.nproc, f"{req.frames} frames in windows of {req.window}"):
        res = run(req, stream=rank_lines if args.json else True)
    return finish(args, files, res, res["clip"] if res["clip"] is not None else res["latents"],
                  print_report)


def main_causal(args: argparse.Namespace) -> int:
    """`--causal`: a clip streamed chunk after chunk, with its KV cache under CP."""
    from cpcourse.runs.stream import print_report, run

    files = ClipFiles(**request_values(ClipFiles, args))
    req = StreamRequest(**request_values(StreamRequest, args))  # every refusal before a start
    with running(req.nproc, f"{req.prompt} streamed chunk by chunk, KV cache {req.kv_cache}"):
        res = run(req, stream=rank_lines if args.json else True)
    return finish(args, files, res, res["clip"], print_report)


def main_approx(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`--approx` or `--cache`: the shipped model's clip sampled approximately; a flag that
    is not ApproxRequest's (an exact run's method, a mesh, a window, another size) is refused."""
    from cpcourse.runs.approx import print_report, run

    refuse_others(parser, args, ApproxRequest, "with --approx or --cache: they sample the "
                  "shipped model's clip, split by --split", also=("save", "gif", "force"))
    files = ClipFiles(**request_values(ClipFiles, args))
    req = ApproxRequest(**request_values(ApproxRequest, args))
    with running(req.nproc, f"{req.run.prompt} with {req.approx}"
                 + (f", cache {req.cache}" if req.cache else "")):
        res = run(req, stream=rank_lines if args.json else True)
    return finish(args, files, res, res["clip"], print_report)


def main_comm(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`--comm-dtype`: the shipped model's clip with its attention traffic in that dtype."""
    from cpcourse.runs.comm_generate import print_report, run

    refuse_others(parser, args, CommRequest, "with --comm-dtype: it samples the shipped model "
                  "at its own size and settings in fp32; drop it")
    req = CommRequest(**request_values(CommRequest, args))
    with running(req.nproc, f"{req.prompt}, attention traffic in {req.comm_dtype}"):
        report = run(req)
    return finish(args, ClipFiles(), {"report": report}, None, print_report)  # it writes none


def refuse_others(parser: argparse.ArgumentParser, args: argparse.Namespace, request_cls,
                  why: str, also=()) -> None:
    """Refuse the first flag typed that is not a field of `request_cls` (nor in `also`)."""
    takes = {f.name for f in fields(request_cls)} | {"json", *also}
    for action in parser._actions:
        if action.option_strings and action.dest not in takes and given(parser, args,
                                                                           action.dest):
            raise InputError(f"{action.option_strings[0]} has no effect {why}")


def finish(args: argparse.Namespace, files: ClipFiles, res: dict, out, print_report) -> int:
    """Write --gif and --save, then print the report (one JSON object with --json) and the
    files written."""
    save_gif = None
    if files.gif:  # matplotlib loads only when a GIF is drawn
        from cpcourse.viz.clips import save_gif
    files.write(res, out, gif_writer=save_gif)
    if args.json:
        print(json.dumps(res["report"], allow_nan=False))
        return 0
    print_report(res["report"])
    for key in ("saved", "gif"):  # every mode writes its files alike
        if key in res["report"]:
            print(f"  wrote {res['report'][key]}" + (" (and its .json)" * (key == "saved")))
    return 0


def _print_report(args: argparse.Namespace, report: dict, layout) -> None:
    from cpcourse.viz.fmt import nbytes as mb
    from cpcourse.viz.fmt import plural

    what = f"'{report['prompt']}'" if "prompt" in report else f"random-weight {report['shape']}"
    procs = plural(report["nproc"], "process", "processes")
    print(f"sampled {what} on {procs}, frames per rank "
          f"{report['frames_per_rank']}, {report['seconds']:.2f} s sampling "
          f"({report['seconds_per_step'] * 1e3:.1f} ms per step)")
    if "track" in report:
        tr = report["track"]
        print(f"  the tracker sees: a {tr['shape']} moving {tr['direction']}, one object in "
              f"{100 * tr['present_fraction']:.0f}% of frames "
              f"({'matches' if report['matches_prompt'] else 'does NOT match'} the prompt)")
    if "layout" in report:
        print(f"  layout {layout}: replicas identical {report['replicas_identical']}, bytes per "
              f"step as predicted {report['bytes_match_prediction']}")
        for r, (m, sent) in enumerate(zip(report["peak_bytes_per_rank"],
                                          report["bytes_per_step_by_dim"], strict=True)):
            dims = ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sent.items() if v)
            print(f"  rank {r}: peak tensor memory {mb(m)}; sent per step: {dims or 'nothing'}")
    else:
        for r, (m, p) in enumerate(zip(report["peak_bytes_per_rank"],
                                       report["predicted_peak_bytes_per_rank"], strict=True)):
            print(f"  rank {r}: peak tensor memory {mb(m)} measured, {mb(p)} predicted")
    if "max_abs_diff_vs_single_process" in report:
        print(f"  {describe(report)}")
    if "max_abs_diff_vs_compare" in report:
        print(f"  max |difference| vs {args.compare_to}: {report['max_abs_diff_vs_compare']:.3g}")
