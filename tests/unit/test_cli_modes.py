"""Every mode table (`cpcourse.support.modes`): each flag of a command has a place, and a flag set
where its mode is off is refused, naming the flag, while the same flag in its mode passes.

    python -m pytest tests/unit/test_cli_modes.py
"""

from __future__ import annotations

import argparse

import pytest

from cpcourse.bench import ring as bench_ring
from cpcourse.cli import calc, generate, main, models, train, vae
from cpcourse.support.errors import ArgumentParser, InputError
from cpcourse.support.modes import ALWAYS, refuse_inactive


def _plan_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="cpcourse plan")
    calc.add_plan_args(p)
    return p


# command: (parser, flag table, conditions, argv every run needs,
#           {condition: (argv that turns it off, argv that turns it on)})
TABLES = {
    "models": (models.build_parser, models.MODE_FLAGS, models.mode_conditions, ["--arch", "wan"],
               {"no_layout": (["--layout", "ring=2"], []),
                "usp": (["--method", "ring"], ["--method", "usp"]),
                "ring": (["--method", "ulysses"], []),
                "sampling": ([], ["--sample-steps", "2"]),
                "one_forward": (["--sample-steps", "2"], [])}),
    "generate": (generate.build_parser, generate.MODE_FLAGS, generate.mode_conditions, [],
                 {"clips": (["--list-prompts"], []),
                  "plain": (["--causal"], []),
                  "causal": ([], ["--causal"]),
                  "trained": (["--weights", "random"], []),
                  "random": ([], ["--weights", "random"]),
                  "random_clip": (["--weights", "random", "--window", "4"],
                                  ["--weights", "random"]),
                  "one_clip": (["--window", "4"], []),
                  "plain_cp": (["--layout", "ring=2"], []),
                  "windows": ([], ["--window", "4"]),
                  "approx": ([], ["--approx", "naive"]),
                  "approximate": ([], ["--cache", "fbcache"]),
                  "pipefusion": (["--approx", "naive"], ["--approx", "pipefusion"]),
                  "cache": ([], ["--cache", "fbcache"]),
                  "comm": (["--approx", "naive"], []),
                  "writes": ([], ["--gif", "x.gif"])}),
    "vae": (vae.build_parser, vae.MODE_FLAGS, vae.mode_conditions, ["--arch", "wan"],
            {"save": ([], ["--save", "x.pt"])}),
    "plan": (_plan_parser, calc.PLAN_FLAGS, calc.plan_conditions, [],
             {"one_plan": (["--validate"], []),
              "latency": (["--objective", "throughput"], []),
              "throughput": ([], ["--objective", "throughput"])}),
    "bench ring": (bench_ring._parser, bench_ring.MODE_FLAGS, bench_ring.mode_conditions, [],
                   {"small": ([], ["--small"]),
                    "sized": (["--small"], []),
                    "not_quick": (["--quick"], []),
                    "compute_only": ([], ["--compute-only"]),
                    "launched": (["--compute-only"], [])}),
    "train": (train.build_parser, train.MODE_FLAGS, train.mode_conditions, [],
              {"one_process": (["--nproc", "2"], []), "cp": ([], ["--nproc", "2"]),
               "causal": ([], ["--causal"])}),
}


def _set(parser: argparse.ArgumentParser, dest: str) -> list[str]:
    """argv that sets `dest` away from its default."""
    action = next(a for a in parser._actions if a.dest == dest and a.option_strings)
    flag, default = action.option_strings[0], parser.get_default(dest)
    if action.nargs == 0:
        return [flag]
    if action.choices:
        return [flag, next(str(c) for c in action.choices if c != default)]
    if action.type is int:
        return [flag, str(default + 1 if isinstance(default, int) else 3)]
    if action.type is float:
        return [flag, str(2 * default + 1 if isinstance(default, float) else 2.5)]
    return [flag, "x" if default != "x" else "y"]


@pytest.mark.parametrize("command", TABLES)
def test_every_flag_has_a_place_and_every_condition_a_case(command):
    make, flags, conditions, base, cases = TABLES[command]
    parser = make()
    dests = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    assert set(flags) == dests, f"{command}: in the table only {set(flags) - dests}, in the " \
                                f"parser only {dests - set(flags)}"
    used = set(flags.values()) - {ALWAYS}
    named = set(conditions(parser.parse_args(base)))
    assert used <= named, f"{command}: conditions nobody defines: {used - named}"
    assert set(cases) == named, f"{command}: conditions without a test case: {named ^ set(cases)}"


@pytest.mark.parametrize("command", TABLES)
def test_a_flag_outside_its_mode_is_refused_and_inside_it_passes(command):
    make, flags, conditions, base, cases = TABLES[command]
    parser = make()
    for dest, condition in flags.items():
        if condition == ALWAYS:
            continue
        off, on = cases[condition]
        value = _set(parser, dest)
        args = parser.parse_args(base + off + value)
        assert not conditions(args)[condition][0], (command, dest, "the off case is on")
        with pytest.raises(InputError) as info:
            refuse_inactive(parser, args, flags, conditions(args))
        assert str(info.value).startswith(f"{value[0]} has no effect here"), (command, dest,
                                                                             str(info.value))
        args = parser.parse_args(base + on + value)
        refuse_inactive(parser, args, flags, conditions(args))  # no refusal in its own mode


@pytest.mark.parametrize("argv, flag", [
    (["generate", "--list-prompts", "--prompt", "x"], "--prompt"),
    (["generate", "--window", "4", "--layout", "ring=2"], "--layout"),
    (["plan", "--validate", "--gpu", "h100"], "--gpu"),
    (["bench", "ring", "--small", "--nproc", "0", "--seq-len", "-5"], "--nproc"),
    (["models", "--arch", "wan", "--method", "ring", "--ulysses", "2"], "--ulysses"),
])
def test_the_commands_refuse_in_one_line_before_starting(argv, flag, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and f"{flag} has no effect here" in err, err


def test_released_for_a_model_without_recorded_dtypes_is_refused_by_the_planner(capsys):
    """The planner knows which models' released dtypes are recorded; the CLI names the flag."""
    assert main(["plan", "--model", "mochi-1", "--gpus", "8", "--released"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith("cpcourse: error: --released: no released dtypes are recorded for "
                          "mochi-1"), err
