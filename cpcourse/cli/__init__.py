"""The `cpcourse` command: calculators, the demo, benchmarks, grading and the doctor.

    cpcourse tokens --model wan2.1-t2v-14b --json
    cpcourse --help

Every subcommand takes `--json` and then prints one JSON object on stdout. Bad input exits with
status 2 and one line on stderr that says what to change (never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --verbose anywhere (or CPCOURSE_VERBOSE=1): a failed launch prints every rank's detail.
    verbose = "--verbose" in argv or os.environ.get("CPCOURSE_VERBOSE") == "1"
    argv = [a for a in argv if a != "--verbose"]
    try:
        code = run(argv)
    except InputError as exc:
        print(f"cpcourse: error: {exc}", file=sys.stderr)
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
    return code


if __name__ == "__main__":
    sys.exit(main())
