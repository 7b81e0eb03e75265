"""The files `cpcourse generate` reads and writes: --compare-to, --save (with its .json report)
and --gif, checked before any process starts and written atomically after the run.

    cpcourse generate --nproc 2 --save /tmp/clip.pt --gif /tmp/clip.gif
"""

from __future__ import annotations

import json
import os

import torch

from cpcourse.support.errors import InputError, require


def load_compare(path: str) -> torch.Tensor:
    """The tensor saved by an earlier `generate --save`, read before any process starts."""
    try:
        other = torch.load(path, weights_only=True)
    except Exception as exc:  # a text, empty, JSON or foreign pickle file: all say the same
        raise InputError(f"--compare-to {path}: not a file saved by `cpcourse generate --save` "
                         f"({type(exc).__name__})") from None
    require(isinstance(other, torch.Tensor), f"--compare-to {path} holds no tensor")
    return other


def check_out(flag: str, path: str) -> None:
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    require(not os.path.isdir(target), f"{flag} {path} is a directory: give a file name in it")
    require(os.path.isdir(folder), f"{flag} {path}: the folder {folder} does not exist")
    require(os.access(folder, os.W_OK), f"{flag} {path}: the folder {folder} is not writable")


def save(tensor: torch.Tensor, report: dict, path: str) -> None:
    """Write the tensor and its .json report, each to a temporary file renamed into place, so
    a failure leaves neither a half-written file nor a .pt without its report."""
    tmp_pt, tmp_json = f"{path}.tmp-{os.getpid()}", f"{path}.json.tmp-{os.getpid()}"
    try:
        torch.save(tensor, tmp_pt)
        with open(tmp_json, "w") as fh:
            json.dump(report, fh, indent=1, allow_nan=False)
        os.replace(tmp_json, path + ".json")
        os.replace(tmp_pt, path)
    except OSError as exc:
        raise InputError(f"--save {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        for tmp in (tmp_pt, tmp_json):
            if os.path.exists(tmp):
                os.remove(tmp)


def write_outputs(args, res: dict, out: torch.Tensor) -> None:
    """--gif and --save, after a run; both were checked writable before it started."""
    if args.gif:
        from cpcourse.viz.clips import save_gif

        save_gif(res["clip"], args.gif)
        res["report"]["gif"] = args.gif
    if args.save:
        save(out, res["report"], args.save)
        res["report"]["saved"] = args.save
