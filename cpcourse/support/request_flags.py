"""A command's flags built from its experiment's Request: one declaration, two spellings.

    cpcourse vae --help    # every flag below comes from `cpcourse.runs.vae.VaeRequest`

`build_parser(prog, Request)` adds one flag per field of the Request (`--frames` for `frames`,
`--no-x`-free booleans as `store_true`), with the field's help, choices and default, plus
`--json`. `request_from_args(parser, Request, args)` refuses a flag typed where it cannot act
(the field's `acts` condition, `Request.conditions(values)`), then builds the Request, whose own
checks run in `__post_init__` (its InputError names the field; `cpcourse.cli.as_flags` turns
the name into the flag when the command prints it). It lives in `support`, below every
chapter, so that the subcommands (`cpcourse.cli`) and the benchmarks (`cpcourse.bench.ring`)
build their command lines the same way.
"""

from __future__ import annotations

import dataclasses

from cpcourse.support.errors import ArgumentParser
from cpcourse.support.modes import ALWAYS, refuse_inactive
from cpcourse.support.request import fields


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser(prog: str, request_cls, description: str) -> ArgumentParser:
    """An ArgumentParser with a flag per command-line field of `request_cls`, and `--json`."""
    p = ArgumentParser(prog=prog, description=description)
    add_request_flags(p, request_cls)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def options(request_cls) -> list[str]:
    """The option strings of `request_cls`'s command-line fields (`--frames`, `--cfg`...)."""
    return [o for f in _cli_fields(request_cls) for o in options_of(f)]


def options_of(f) -> tuple[str, ...]:
    return f.metadata.get("spelled") or (flag_name(f.name),)


def add_request_flags(p, request_cls, skip=(), unset: bool = False, selects=()) -> None:
    """Add a flag per command-line field of `request_cls` to `p`, but those in `skip` (a
    command whose other modes share the flag spells it itself). `unset`: every default None,
    so a command can tell a flag typed from one left out (`cpcourse train` without --nproc);
    the Request's default is shown in the help, but for the flags that pick the mode (those
    acting always, and `selects`)."""
    for f in _cli_fields(request_cls):
        if f.name in skip:
            continue
        meta = f.metadata
        flags = options_of(f)
        required = f.default is dataclasses.MISSING
        default = None if required else f.default
        # a default is shown where it applies: not for a flag that picks a mode (`unset`)
        hidden = required or default is None or isinstance(default, bool) or (
            unset and (meta.get("acts", ALWAYS) == ALWAYS or f.name in selects))
        shown = "" if hidden else f" ({default})"
        boolean = f.type in ("bool", bool)
        if unset:  # the Request's default fills in what the command line leaves out
            default = False if boolean else None
        kw = {"dest": f.name, "help": meta.get("help", "") + shown, "default": default}
        if boolean:
            p.add_argument(*flags, action="store_true", **kw)
            continue
        if meta.get("choices"):
            kw["choices"] = list(meta["choices"])
        kw["type"] = _parse_type(f.type)
        p.add_argument(*flags, required=required, metavar=meta.get("metavar"), **kw)


def request_values(request_cls, args, skip=()) -> dict:
    """The command-line fields of `request_cls` the arguments give a value (not None)."""
    return {f.name: getattr(args, f.name) for f in _cli_fields(request_cls)
            if f.name not in skip and getattr(args, f.name, None) is not None}


def _parse_type(annotation):
    kinds = {"int": int, "float": float, "str": str}
    text = str(annotation)
    for name, kind in kinds.items():
        if text == name or text.startswith(f"{name} |") or text.startswith(f"{name}|"):
            return kind
    return str


def _cli_fields(request_cls) -> list:
    """The fields a command line sets: not the notebook-only ones, not those derived in
    `__post_init__` (init=False)."""
    return [f for f in fields(request_cls) if f.init and f.metadata.get("cli", True)]


def mode_table(request_cls, skip=()) -> dict[str, str]:
    """Where each flag acts (`cpcourse.support.modes`), read from the fields' `acts`."""
    return {f.name: f.metadata.get("acts", ALWAYS) for f in _cli_fields(request_cls)
            if f.name not in skip} | {"json": ALWAYS}


def request_conditions(request_cls, args) -> dict[str, tuple[bool, str]]:
    """The Request's `conditions(values)`: which modes these arguments turn on (none: {})."""
    values = {f.name: getattr(args, f.name) for f in _cli_fields(request_cls)}
    return request_cls.conditions(values) if hasattr(request_cls, "conditions") else {}


def request_from_args(parser, request_cls, args, flags: dict | None = None,
                      conditions: dict | None = None):
    """The Request the command line asks for, or InputError naming the flag to change.
    `flags` and `conditions`: the whole command's mode table and conditions, when it has
    flags beyond the Request's (default: the Request's own)."""
    flags = mode_table(request_cls) if flags is None else flags
    conditions = request_conditions(request_cls, args) if conditions is None else conditions
    refuse_inactive(parser, args, flags, conditions)
    values = {f.name: getattr(args, f.name) for f in _cli_fields(request_cls)}
    return request_cls(**values)  # its checks name the field; `cpcourse.cli.as_flags` the flag
