"""The files a clip of `cpcourse generate` reads and writes, declared once: `ClipFiles`.

    cpcourse generate --nproc 2 --save /tmp/clip.pt --gif /tmp/clip.gif --compare-to old.pt

`ClipFiles(save=..., gif=..., force=..., compare_to=...)`: the fields are the command's flags
(the help and the mode each acts in, as a Request's are: `cpcourse.cli.generate` builds the
flags from them and refuses one that cannot act). Made before any process starts, it checks
that each output can be created (`cpcourse.support.out_files.check_output`: an existing file
needs `force`) and that --gif is neither --save nor its .json report (one would overwrite the
other after the run). `load_compare()` reads the --compare-to tensor before the run;
`write(res, out, gif_writer)` writes --gif and --save (the tensor and its .json report) after
it, each to a temporary file renamed into place. The GIF writer is passed in
(`cpcourse.viz.clips.save_gif`): drawing lives in `viz`, a chapter this one does not import.
The messages name the flags, since only the command line fills these fields.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import torch

from cpcourse.support.errors import InputError, require
from cpcourse.support.out_files import check_output, replacing
from cpcourse.support.request import flag


@dataclass(frozen=True)
class ClipFiles:
    """The clip's files, checked when made (before any process starts). `acts` names the
    condition of `cpcourse.cli.generate.mode_conditions` in which each flag acts."""

    save: str | None = flag(None, "write the clip [T, 3, H, W] (random weights: the latents) "
                            "here", acts="clips")
    gif: str | None = flag(None, "write the clip as an animated GIF here", acts="trained")
    force: bool = flag(False, "--save/--gif may replace an existing file (else refused)",
                       acts="writes")
    compare_to: str | None = flag(None, "a file an earlier --save wrote: report the largest "
                                  "difference", acts="one_clip")

    def __post_init__(self):
        gif = None
        if self.gif:
            gif = os.path.realpath(check_output(self.gif, self.force, "--gif"))
        if self.save:
            check_output(self.save, self.force, "--save")
            report = self.save + ".json"
            require(not os.path.isdir(report), f"--save {self.save}: its report {report} is a "
                    "directory: give --save another name")
            check_output(report, self.force, "--save's report")
            for what, path in (("--save", self.save), ("--save's report", report)):
                require(gif != os.path.realpath(path), f"--gif {self.gif} is also {what} "
                        f"{path}: one would overwrite the other; give them different names")

    def load_compare(self) -> torch.Tensor | None:
        """The tensor an earlier `generate --save` wrote to `compare_to` (None without it),
        read before any process starts."""
        if not self.compare_to:
            return None
        path = self.compare_to
        try:
            other = torch.load(path, weights_only=True)
        except Exception as exc:  # a text, empty, JSON or foreign pickle file: all say the same
            raise InputError(f"--compare-to {path}: not a file saved by `cpcourse generate "
                             f"--save` ({type(exc).__name__})") from None
        require(isinstance(other, torch.Tensor), f"--compare-to {path} holds no tensor")
        require(other.is_floating_point() and other.numel() > 0, f"--compare-to {path} holds a "
                f"{other.dtype} tensor of shape {tuple(other.shape)}: not a saved clip or "
                "latents")
        bad = int((~torch.isfinite(other)).sum())
        require(bad == 0, f"--compare-to {path} holds {bad} values that are not finite (NaN or "
                "inf): a difference from it would mean nothing; give a file an earlier run saved")
        return other

    def check_compare(self, other: torch.Tensor | None, shape: tuple) -> None:
        """The --compare-to tensor has the shape this run makes (known before it starts)."""
        if other is not None:
            require(tuple(other.shape) == tuple(shape), f"--compare-to {self.compare_to} holds "
                    f"a tensor of shape {tuple(other.shape)}, this run makes {tuple(shape)}")

    def write(self, res: dict, out: torch.Tensor | None, gif_writer=None) -> None:
        """--gif (`gif_writer(clip, path, name=...)` draws `res["clip"]` [T, 3, H, W]) and
        --save (`out` and `res["report"]`), after the run; each written file's path goes into
        the report (`gif`, `saved`)."""
        if self.gif:
            if gif_writer is None:  # the caller's slip, not the user's
                raise TypeError("ClipFiles.write with gif: pass gif_writer (viz.clips.save_gif)")
            gif_writer(res["clip"], self.gif, name="--gif")
            res["report"]["gif"] = self.gif
        if self.save:
            save(out, res["report"], self.save)
            res["report"]["saved"] = self.save


def save(tensor: torch.Tensor, report: dict, path: str) -> None:
    """Write the tensor and its .json report, each to a temporary file renamed into place (the
    report first), so a failure leaves neither a half-written file nor a .pt without its
    report."""
    with replacing(path, "--save") as tmp_pt:
        torch.save(tensor, tmp_pt)
        with replacing(path + ".json", "--save") as tmp_json, open(tmp_json, "w") as fh:
            json.dump(report, fh, indent=1, allow_nan=False)
