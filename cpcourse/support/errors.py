"""Errors a learner can act on.

    python -c "from cpcourse.planner.tokens import video_tokens; video_tokens(-1, 1280, 81)"

Every check on user input raises `InputError`, a `ValueError` whose message is one line that
says what to change. The command line prints that line and exits with status 2.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import math
import re


class InputError(ValueError):
    """Bad input from a caller: the message says what to change."""


def require(ok: bool, message: str) -> None:
    """Raise `InputError(message)` unless `ok`."""
    if not ok:
        raise InputError(message)


def did_you_mean(word, choices) -> str:
    """"did you mean 'x'? " when one of `choices` is close to `word` (difflib), else "": the
    start of an unknown-name message, before the list of every valid name."""
    if not isinstance(word, str) or not word:
        return ""
    by_lower = {str(c).lower(): str(c) for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"did you mean {by_lower[close[0]]!r}? " if close else ""


def positive_int(name: str, value, *, allow_zero: bool = False) -> int:
    """Return `value` as an int, or raise an `InputError` naming the parameter `name` to fix."""
    # is_integer() is False for nan and inf, which int() would refuse naming no argument
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()):
        raise InputError(f"{name} must be a whole number, got {value!r}")
    value = int(value)
    low = 0 if allow_zero else 1
    require(value >= low, f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def _number(name: str, value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number, got {value!r}") from None


def positive_float(name: str, value, *, low: float | None = None,
                   high: float | None = None) -> float:
    """Return `value` as a float > 0 (and within [low, high] when given), or raise an
    `InputError` naming the flag to fix. Bounds keep later arithmetic finite: 1e308 fps times
    1e308 seconds is infinity, a bandwidth of 1e-320 GB/s divides to infinity."""
    value = _number(name, value)
    require(value > 0 and math.isfinite(value),
            f"{name} must be a positive finite number, got {value}")
    lo, hi = -math.inf if low is None else low, math.inf if high is None else high
    if not lo <= value <= hi:
        bounds = (f"between {low:g} and {high:g}" if low is not None and high is not None
                  else f">= {low:g}" if low is not None else f"<= {high:g}")
        raise InputError(f"{name} must be {bounds}, got {value:g}")
    return value


def finite_float(name: str, value) -> float:
    """Return `value` as a finite float (any sign), or raise an `InputError` naming the flag."""
    value = _number(name, value)
    require(math.isfinite(value), f"{name} must be finite, got {value}")
    return value


def guidance_scale(name: str, value) -> float:
    """A classifier-free guidance scale: finite and within +-100. Real models use 1 to 15;
    past 100 the sample only blows up (in fp16, to inf)."""
    value = finite_float(name, value)
    require(abs(value) <= 100, f"{name} must be between -100 and 100, got {value:g}")
    return value


def seed_int(name: str, value) -> int:
    """A seed torch's generators take: a whole number in [0, 2**63)."""
    require(isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63,
            f"{name} must be a whole number in [0, 2**63), got {value!r}")
    return value


class ArgumentParser(argparse.ArgumentParser):
    """argparse for every `cpcourse` command: a usage error is an InputError (one line, exit 2
    from the command line) instead of a usage dump and SystemExit."""

    def error(self, message):
        where = "" if self.prog == "cpcourse" else f"{self.prog}: "
        guess = self._guess(message).rstrip()
        if guess and " (choose from " in message:  # the guess before the list of every choice
            message = message.replace(" (choose from ", f": {guess} (choose from ", 1)
        elif guess:
            message = f"{message} ({guess})"
        raise InputError(f"{where}{message} (see `{self.prog} --help`)")

    def _guess(self, message: str) -> str:
        """"did you mean ...?" for a mistyped choice or option (the options of every
        subcommand parser count: the top parser reports a subcommand's unknown flag)."""
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if choice:
            return did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if not unknown:
            return ""
        options = [o for parser in self._parsers() for a in parser._actions
                   for o in a.option_strings]
        flags = [w.split("=", 1)[0] for w in unknown.group(1).split() if w.startswith("--")]
        return next((g for g in (did_you_mean(f, options) for f in flags) if g), "")

    def _parsers(self) -> list:
        subs = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        return [self, *(p for a in subs for p in a.choices.values())]

    def _add_action(self, action):
        # Record each option the command line sets (in `namespace._given`), so that a flag
        # typed with its default value still counts as given (`cpcourse.support.modes`).
        if action.option_strings:
            action.__class__ = _noting(type(action))
        return super()._add_action(action)

    def parse_known_args(self, args=None, namespace=None):
        # An empty value (`--model ""`) used to mean "not given" and quietly take the default.
        ns, extra = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(ns, action.dest, None)
            if isinstance(value, str) and not value.strip() and value != action.default:
                flag = action.option_strings[0] if action.option_strings else action.dest
                raise InputError(f"{flag} is empty: give it a value, or leave it out")
        return ns, extra


@functools.cache
def _noting(action_class: type) -> type:
    """`action_class` that also adds its dest to the namespace's `_given` set when used."""

    class Noting(action_class):
        def __call__(self, parser, namespace, values, option_string=None):
            namespace.__dict__.setdefault("_given", set()).add(self.dest)
            super().__call__(parser, namespace, values, option_string)

    Noting.__name__ = action_class.__name__
    return Noting
