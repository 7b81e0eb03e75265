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

from cpcourse.launch.errors import LaunchError
from cpcourse.support.errors import ArgumentParser, InputError

# Subcommands implemented in their own modules: name -> (module, one-line help).
# Each module exposes `main(argv) -> int` and raises InputError on bad input.
DELEGATED = {
    "demo": ("cpcourse.cli.demo", "run the ring on P local processes and check it"),
    "bench": ("cpcourse.bench", "benchmarks: kernel, ring (--json)"),
    "grade": ("cpcourse.course.grading",
              "grade every exercise (--impl exercises|solutions, --json)"),
    "doctor": ("cpcourse.cli.doctor", "check this machine: versions, threads, CUDA, gloo"),
    "generate": ("cpcourse.cli.generate",
                 "generate a clip with the trained shapes model on P processes"),
    "train": ("cpcourse.cli.train", "train the tiny video DiT on moving shapes"),
    "models": ("cpcourse.cli.models",
               "a tiny real diffusers video transformer (Wan, HunyuanVideo, ...) under CP"),
}
CALCULATORS = ("tokens", "memory", "comm", "plan")
# Inside the user's own torchrun these run as its rank; these others start processes of their
# own that cannot, and are refused there.
TORCHRUN_COMMANDS = ("demo", "generate", "models", "bench ring")
NOT_UNDER_TORCHRUN = ("bench", "grade")


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
    head = 2 if argv[:1] == ["bench"] else 1
    command = " ".join(argv[:head])
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


# Library errors name the parameter ("height 721 is not divisible by 16", "dtype must be one of
# fp32, ..."); on the command line the same message names the flag that sets it.
PARAM_FLAGS = {"height": "--height", "width": "--width", "frames": "--frames", "fps": "--fps",
               "seconds": "--seconds", "vae_temporal": "--vae-temporal",
               "vae_spatial": "--vae-spatial", "text_tokens": "--text-tokens", "patch": "--patch",
               "dtype": "--dtype"}


def as_flags(message: str) -> str:
    """A library message that starts with a parameter's name, starting with its flag instead."""
    m = re.match(r"([a-z][a-z_]*)(?=[ ,:])", message)
    if m is None or m.group(1) not in PARAM_FLAGS:
        return message
    return PARAM_FLAGS[m.group(1)] + message[m.end():]


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
        if verbose:
            print(str(exc), file=sys.stderr)
        hint = "" if verbose else " (add --verbose for each rank's traceback)"
        print(f"cpcourse: error: {exc.summary()}{hint}", file=sys.stderr)
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
