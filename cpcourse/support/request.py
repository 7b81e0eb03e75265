"""An experiment's parameters declared once: a frozen dataclass whose fields are its flags.

    python -c "from cpcourse.runs.vae import VaeRequest; print(VaeRequest(arch='wan', nproc=2))"

A runner in `cpcourse.runs` declares what one run takes as a frozen dataclass (`...Request`)
whose fields are made with `flag(default, help, ...)`: the field's name is the parameter, and
its metadata is what the command line needs (the help text, the choices, when the flag acts).
`__post_init__` checks the values, so a Request that exists is a valid run, built the same way
from Python, a notebook or the command line (`cpcourse.support.request_flags` turns the fields
into argparse flags). The rank functions receive the Request itself and read `req.frames`,
never a string-keyed dict: one spelling from the flag to the rank.
"""

from __future__ import annotations

import dataclasses

from cpcourse.support.errors import positive_float, positive_int, require, seed_int
from cpcourse.support.modes import ALWAYS

MAX_NPROC = 64  # local ranks; past this a launch only thrashes (and 1000 never finished starting)


def flag(default=dataclasses.MISSING, help: str = "", *, choices=None, acts: str = ALWAYS,
         cli: bool = True, metavar: str | None = None, spelled: tuple[str, ...] = ()):
    """A Request field and its flag. `acts`: ALWAYS, or the name of a condition the Request's
    `conditions()` defines (the flag is refused when given where it cannot act). `cli=False`
    keeps a field out of the command line (a notebook-only knob). `spelled`: the option
    strings when they are not `--field-name` (a flag older than its field keeps its name)."""
    meta = {"help": help, "choices": tuple(choices) if choices else None, "acts": acts,
            "cli": cli, "metavar": metavar, "spelled": tuple(spelled)}
    return dataclasses.field(default=default, metadata=meta)


def fields(cls) -> list[dataclasses.Field]:
    """The Request's fields in declaration order."""
    return list(dataclasses.fields(cls))


def set_derived(req, **values) -> None:
    """Set fields of the frozen Request `req` from its own `__post_init__`: the values it
    derives or normalises (a parsed layout, a default that depends on the weights), once."""
    for name, value in values.items():
        object.__setattr__(req, name, value)


def request_of(cls, spec, **overrides):
    """A `cls` Request from one (with `overrides` replaced) or from a dict of its fields
    (notebooks write dicts); it checks itself either way."""
    if isinstance(spec, cls):
        return dataclasses.replace(spec, **overrides) if overrides else spec
    return cls(**{**spec, **overrides})


def check_nproc(nproc, flag: str = "nproc") -> int:
    """`nproc` as a whole number of local ranks in 1 .. MAX_NPROC, or an InputError naming
    `flag` (every Request through `check_common`, `cpcourse.launch` and the commands that take
    --nproc outside a Request check it here, each with its own name for it)."""
    nproc = positive_int(flag, nproc)
    require(nproc <= MAX_NPROC, f"{flag} {nproc} is more local processes than cpcourse starts: "
            f"use {MAX_NPROC} or fewer (more ranks than cores only oversubscribe the machine)")
    return nproc


def check_common(req, whole: tuple[str, ...] = ()) -> None:
    """The checks every Request with these fields shares: `nproc`, `seed`, `timeout`, each
    field's declared `choices`, then the fields named in `whole` (each a whole number > 0).
    Library words (the parameter's name), not flags."""
    for f in fields(type(req)):
        value, choices = getattr(req, f.name), f.metadata.get("choices")
        if choices and value is not None and value not in choices:  # None: left unset
            raise_choice(f.name, value, choices)
    if getattr(req, "nproc", None) is not None:  # None: the Request's own default, later
        check_nproc(req.nproc)
    if hasattr(req, "seed"):
        seed_int("seed", req.seed)
    if getattr(req, "timeout", None) is not None:  # None: the Request's own default, later
        positive_float("timeout", req.timeout, high=86_400)
    for name in whole:
        positive_int(name, getattr(req, name))


def raise_choice(name: str, value, choices) -> None:
    import difflib

    near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    require(False, f"{name} must be one of {', '.join(map(str, choices))}, got {value!r}{hint}")


def whole(name: str, value, *, low: int = 1, high: int | None = None) -> int:
    """`value` as a whole number in [low, high], or an InputError naming `name`."""
    value = positive_int(name, value, allow_zero=low == 0)
    require(value >= low, f"{name} must be at least {low}, got {value}")
    if high is not None:
        require(value <= high, f"{name} {value}: use at most {high}")
    return value
