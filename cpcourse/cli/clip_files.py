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
    require(other.is_floating_point() and other.numel() > 0, f"--compare-to {path} holds a "
            f"{other.dtype} tensor of shape {tuple(other.shape)}: not a saved clip or latents")
    bad = int((~torch.isfinite(other)).sum())
    require(bad == 0, f"--compare-to {path} holds {bad} values that are not finite (NaN or inf): "
            "a difference from it would mean nothing; give a file an earlier run saved")
    return other


def check_outputs(args) -> None:
    """--gif and --save (and its .json report) checked before the run: each file can be
    created (`support.out_files.check_output`: an existing one needs --force), and --gif is
    neither of the other two (one would overwrite the other after the run). The mode table
    refused --gif with random weights already."""
    from cpcourse.support.out_files import check_output

    force = getattr(args, "force", False)
    gif = None
    if args.gif:
        gif = os.path.realpath(check_output(args.gif, force, "--gif"))
    if args.save:
        check_output(args.save, force, "--save")
        report = args.save + ".json"
        require(not os.path.isdir(report), f"--save {args.save}: its report {report} is a "
                "directory: give --save another name")
        check_output(report, force, "--save's report")
        for what, path in (("--save", args.save), ("--save's report", report)):
            require(gif != os.path.realpath(path), f"--gif {args.gif} is also {what} "
                    f"{path}: one would overwrite the other; give them different names")


def save(tensor: torch.Tensor, report: dict, path: str) -> None:
    """Write the tensor and its .json report, each to a temporary file renamed into place (the
    report first), so a failure leaves neither a half-written file nor a .pt without its
    report."""
    from cpcourse.support.out_files import replacing

    with replacing(path, "--save") as tmp_pt:
        torch.save(tensor, tmp_pt)
        with replacing(path + ".json", "--save") as tmp_json, open(tmp_json, "w") as fh:
            json.dump(report, fh, indent=1, allow_nan=False)


def write_outputs(args, res: dict, out: torch.Tensor) -> None:
    """--gif and --save, after a run; `check_outputs` passed them before it started."""
    if args.gif:
        from cpcourse.viz.clips import save_gif

        save_gif(res["clip"], args.gif, name="--gif")
        res["report"]["gif"] = args.gif
    if args.save:
        save(out, res["report"], args.save)
        res["report"]["saved"] = args.save
