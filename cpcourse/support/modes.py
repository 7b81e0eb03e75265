"""Which flag acts in which mode of a command: a flag that cannot act is refused, not ignored.

    cpcourse models --arch wan --method ring --ulysses 2    # exit 2: --ulysses needs --method usp

A command lists every flag it has once, with the condition under which it acts (`ALWAYS`, or
the name of a condition). The command says, for the arguments it was given, which conditions
hold and, for each, what the user would add to meet it. `refuse_inactive` then refuses the
first flag typed on the command line whose condition does not hold. A flag added to a command
later must be placed in its table (the tests walk every table and every parser).
"""

from __future__ import annotations

import argparse

from cpcourse.support.errors import InputError

ALWAYS = "always"


def option(parser: argparse.ArgumentParser, dest: str) -> str:
    """The flag a user types for `dest` (its first option string)."""
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    raise KeyError(dest)


def given(parser: argparse.ArgumentParser, args: argparse.Namespace, dest: str) -> bool:
    """Whether the command line set `dest`: cpcourse's ArgumentParser records each flag typed
    (even with its default value); for another parser, whether it differs from its default."""
    if hasattr(args, "_given"):
        return dest in args._given
    return getattr(args, dest) != parser.get_default(dest)


def refuse_inactive(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    flags: dict[str, str], conditions: dict[str, tuple[bool, str]]) -> None:
    """Raise InputError for the first given flag whose condition does not hold.

    `flags`: dest -> ALWAYS or a condition's name. `conditions`: name -> (holds, what it
    needs), e.g. {"usp": (args.method == "usp", "--method usp")}.
    """
    missing = [a.dest for a in parser._actions if a.option_strings and a.dest != "help"
               and a.dest not in flags]
    if missing:  # a programming error, caught by the tests, never a user's
        raise KeyError(f"{parser.prog}: flags with no place in the mode table: {missing}")
    for dest, condition in flags.items():
        if condition == ALWAYS or not given(parser, args, dest):
            continue
        holds, needs = conditions[condition]
        if not holds:
            raise InputError(f"{option(parser, dest)} has no effect here: it needs {needs}")
