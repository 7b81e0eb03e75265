"""A subcommand's flags built from its experiment's Request: one declaration, two spellings.

    cpcourse vae --help    # every flag below comes from `cpcourse.runs.vae.VaeRequest`

`build_parser(prog, Request)` adds one flag per field of the Request (`--frames` for `frames`,
`--no-x`-free booleans as `store_true`), with the field's help, choices and default, plus
`--json`. `request_from_args(parser, Request, args)` refuses a flag typed where it cannot act
(the field's `acts` condition, `Request.conditions(values)`), then builds the Request, whose own
checks run in `__post_init__` (its InputError names the field; `cpcourse.cli.as_flags` turns
the name into the flag when the command prints it).
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
    for f in fields(request_cls):
        meta = f.metadata
        if not meta.get("cli", True):
            continue
        required = f.default is dataclasses.MISSING
        default = None if required else f.default
        shown = "" if required or default is None or default is False else f" ({default})"
        kw = {"dest": f.name, "help": meta.get("help", "") + shown, "default": default}
        if f.type in ("bool", bool):
            p.add_argument(flag_name(f.name), action="store_true", **kw)
            continue
        if meta.get("choices"):
            kw["choices"] = list(meta["choices"])
        kw["type"] = _parse_type(f.type)
        p.add_argument(flag_name(f.name), required=required, metavar=meta.get("metavar"), **kw)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _parse_type(annotation):
    kinds = {"int": int, "float": float, "str": str}
    text = str(annotation)
    for name, kind in kinds.items():
        if text == name or text.startswith(f"{name} |") or text.startswith(f"{name}|"):
            return kind
    return str


def _cli_fields(request_cls) -> list:
    return [f for f in fields(request_cls) if f.metadata.get("cli", True)]


def mode_table(request_cls) -> dict[str, str]:
    """Where each flag acts (`cpcourse.support.modes`), read from the fields' `acts`."""
    return {f.name: f.metadata.get("acts", ALWAYS) for f in _cli_fields(request_cls)} | {
        "json": ALWAYS}


def request_conditions(request_cls, args) -> dict[str, tuple[bool, str]]:
    """The Request's `conditions(values)`: which modes these arguments turn on (none: {})."""
    values = {f.name: getattr(args, f.name) for f in _cli_fields(request_cls)}
    return request_cls.conditions(values) if hasattr(request_cls, "conditions") else {}


def request_from_args(parser, request_cls, args):
    """The Request the command line asks for, or InputError naming the flag to change."""
    refuse_inactive(parser, args, mode_table(request_cls), request_conditions(request_cls, args))
    values = {f.name: getattr(args, f.name) for f in _cli_fields(request_cls)}
    return request_cls(**values)  # its checks name the field; `cpcourse.cli.as_flags` the flag
