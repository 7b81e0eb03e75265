"""The `cpcourse` command: calculators, the demo, benchmarks, grading and the doctor.

    cpcourse tokens --model wan2.1-t2v-14b --json
    cpcourse --help

Every subcommand takes `--json` and then prints one JSON object on stdout. Bad input exits with
status 2 and one line on stderr that says what to change (never a traceback).
Inside a rank of your own torchrun, `demo`, `generate`, `models` and `bench ring` run as that
rank (`cpcourse.launch.torchrun`): only global rank 0 prints, the other ranks exit 0 silently.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import sys

from cpcourse.launch.errors import LaunchError, LaunchTimeout
from cpcourse.support.errors import ArgumentParser, InputError

# Subcommands implemented in their own modules: name -> (module, one-line help).
# Each module exposes `main(argv) -> int` and raises InputError on bad input.
DELEGATED = {
    "demo": ("cpcourse.cli.demo", "run the ring on P local processes and check it"),
    # every name in cpcourse.bench.BENCHMARKS (tests/unit/test_did_you_mean.py checks)
    "bench": ("cpcourse.bench", "benchmarks: kernel, ring, launch, shapes, models, windows, "
                                "mesh, vae, approx, sparse, tiling, gpu (`cpcourse bench "
                                "--help`)"),
    "grade": ("cpcourse.course.grading",
              "grade every exercise (--impl exercises|solutions, --json)"),
    "doctor": ("cpcourse.cli.doctor", "check this machine: versions, threads, CUDA, gloo"),
    "generate": ("cpcourse.cli.generate",
                 "generate a clip with the trained shapes model on P processes"),
    "train": ("cpcourse.cli.train", "train the tiny video DiT on moving shapes"),
    "models": ("cpcourse.cli.models",
               "a tiny real diffusers video transformer (Wan, HunyuanVideo, ...) under CP"),
    "vae": ("cpcourse.cli.vae", "a tiny real video VAE decoded on P ranks split along height"),
    "sparse": ("cpcourse.cli.sparse", "block-sparse video attention on P ranks: work, bytes"),
}
CALCULATORS = ("tokens", "memory", "comm", "plan")
# Inside the user's own torchrun these run as its rank; these others start processes of their
# own that cannot, and are refused there.
TORCHRUN_COMMANDS = ("demo", "generate", "models", "bench ring")
NOT_UNDER_TORCHRUN = ("bench", "grade", "vae")
# The commands whose launches take their time limit from a --timeout flag.
TIMEOUT_COMMANDS = ("demo", "generate", "models", "vae", "bench models", "bench ring")


def build_parser() -> argparse.ArgumentParser:
    from cpcourse.cli import calc as calc_cli

    parser = ArgumentParser(prog="cpcourse", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", parser_class=ArgumentParser)
    calc_cli.add_parsers(sub)
    for name, (_, help_text) in DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def run(argv: list[str]) -> int:
    if argv and argv[0] in DELEGATED:
        module = importlib.import_module(DELEGATED[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    from cpcourse.cli import calc as calc_cli

    result, text = calc_cli.run(args)
    if args.json:
        print(json.dumps(result, indent=1, allow_nan=False))
    else:
        print(text)
    return 0


def _command(argv: list[str]) -> str:
    """The (sub)command argv runs: "models", "bench ring"."""
    return " ".join(argv[:2] if argv[:1] == ["bench"] else argv[:1])


@contextlib.contextmanager
def as_torchrun_rank(argv: list[str]):
    """Inside a foreign torchrun rank: refuse the commands that cannot run as one, default
    --nproc to the world size, and let only global rank 0 print (launch() ends the others with
    RankDone once the results are gathered). Yields the argv to run."""
    from cpcourse.launch.torchrun import rank_zero_reports, torchrun_rank

    where = torchrun_rank()
    if where is None:
        yield argv
        return
    command = _command(argv)
    head = len(command.split(" "))
    if command not in TORCHRUN_COMMANDS and command.split(" ")[0] in NOT_UNDER_TORCHRUN:
        raise InputError(f"cpcourse {command} does not run inside a torchrun rank (this is rank "
                         f"{where.rank} of {where.world}): start it without torchrun; under "
                         f"torchrun, {', '.join(TORCHRUN_COMMANDS)} run as the rank")
    if command in TORCHRUN_COMMANDS and not any(a == "--nproc" or a.startswith("--nproc=")
                                                for a in argv):
        # torchrun's own parser refuses a --nproc after the module (an ambiguous abbreviation
        # of its --nproc-per-node) unless `--` comes first: the world says how many anyway.
        argv = [*argv[:head], "--nproc", str(where.world), *argv[head:]]
    with contextlib.ExitStack() as stack:
        stack.enter_context(rank_zero_reports())
        if where.rank != 0:  # rank 0 and its neighbours on a node often share one stdout
            stack.enter_context(contextlib.redirect_stdout(
                stack.enter_context(open(os.devnull, "w"))))  # noqa: SIM115
        yield argv


# Library errors name the parameter: a message starts with its name ("height 721 is not
# divisible by 16"), or names it in backticks ("give `minutes` or `steps`") or with a value
# ("use nproc=4 or fewer"). On the command line the same message names the flag that sets it.
# A parameter's flag is its name with dashes, unless it is listed with a flag of its own.
PARAMS = ("approx", "arch", "attention", "batch", "blend", "cache", "cache_rule", "cache_threshold",
          "cfg_batch", "chunk", "cfg_scale", "cp", "dtype", "ffn", "fps", "frames", "gpus",
          "head_dim", "heads",
          "height", "hidden", "kernel", "label", "layers", "layout", "link", "link_efficiency",
          "max_seconds", "method", "minutes", "nodes", "noise", "nproc", "offload", "out",
          "parallel",
          "params_b", "patch", "patches", "prompt", "released", "sample_steps", "save",
          "seconds", "seed",
          "split", "steps", "stride", "text_encoder", "text_encoder_cpu", "text_tokens",
          "timeout", "tokens", "ulysses",
          "vae_spatial", "vae_temporal", "warmup", "weights", "width", "window")
OWN_FLAGS = {"attention_efficiency": "--attn-efficiency", "bandwidth_gbps": "--bandwidth",
             "full_method": "--full", "temporal_method": "--temporal"}
OWN_FLAGS |= {name: "--" + name.replace("_", "-")
              for name in ("seq_len", "repeats", "methods", "kv_cache", "comm_dtype")}
OWN_FLAGS |= {"repeat": "--repeat"}  # cpcourse models
PARAM_FLAGS = {**{name: "--" + name.replace("_", "-") for name in PARAMS}, **OWN_FLAGS}
_NAMES = "|".join(sorted(PARAM_FLAGS, key=len, reverse=True))
_LEADING = re.compile(rf"^({_NAMES})(?=[ ,:])")
_QUOTED = re.compile(rf"`({_NAMES})`")
_VALUED = re.compile(rf"(?<![\w-])({_NAMES})=")


# A stuck rank's quoted source line ("called at rope.py:34: ...dtype=torch.float64)") is code,
# not a message: it runs to the next rank's part or the end, and is never rewritten.
_SOURCE = re.compile(r"(called at [^\s:]+:\d+: )(.*?)(?=; rank \d+: |; finished: |\n|$)")


def as_flags(message: str) -> str:
    """A library message with each parameter it names replaced by its command-line flag (the
    source lines a timeout quotes are left as they are)."""
    quoted: list[str] = []

    def hide(m: re.Match) -> str:
        quoted.append(m.group(2))
        return f"{m.group(1)}\0{len(quoted) - 1}\0"

    message = _SOURCE.sub(hide, message)
    message = _LEADING.sub(lambda m: PARAM_FLAGS[m.group(1)], message)
    message = _QUOTED.sub(lambda m: PARAM_FLAGS[m.group(1)], message)
    message = _VALUED.sub(lambda m: PARAM_FLAGS[m.group(1)] + " ", message)
    return re.sub(r"\0(\d+)\0", lambda m: quoted[int(m.group(1))], message)


def main(argv: list[str] | None = None) -> int:
    """The `cpcourse` program (argv None: sys.argv, and this is the process's entry point)."""
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    # --verbose anywhere (or CPCOURSE_VERBOSE=1): a failed launch prints every rank's detail.
    verbose = "--verbose" in argv or os.environ.get("CPCOURSE_VERBOSE") == "1"
    argv = [a for a in argv if a != "--verbose"]
    from cpcourse.launch.torchrun import RankDone, end_process

    try:
        with as_torchrun_rank(argv) as argv:
            code = run(argv)
    except RankDone:  # a torchrun rank other than 0: its part is done, rank 0 reports
        code = 0
    except InputError as exc:
        print(f"cpcourse: error: {as_flags(str(exc))}", file=sys.stderr)
        code = 2
    except LaunchError as exc:  # a rank failed or the run timed out: one line, unless asked
        # a timeout names launch()'s `timeout`: the commands that set it do so with --timeout
        flags = as_flags if isinstance(exc, LaunchTimeout) and _command(argv) in \
            TIMEOUT_COMMANDS else str
        if verbose:
            print(flags(str(exc)), file=sys.stderr)
        hint = "" if verbose else " (add --verbose for each rank's traceback)"
        print(f"cpcourse: error: {flags(exc.summary())}{hint}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        print("cpcourse: interrupted", file=sys.stderr)
        code = 130
    sys.stdout.flush()
    if as_program:  # a torchrun rank that joined a group ends here, skipping torch's teardown
        end_process(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
