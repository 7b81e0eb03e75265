"""Files a command writes, all through this one module: each output is checked before any work
(and before any process starts), and written to a temporary file beside it that is renamed into
place, so a failure leaves no half-written file and nothing but a regular file is ever replaced.

    cpcourse train --out /proc/x.safetensors --steps 1   # exit 2 at once, nothing trained

`check_output(path, force, flag)` refuses, in one InputError line naming `flag`: an empty path;
a folder (a trailing slash included); a symbolic link, a device or any other special file (a
rename would replace the link or the machine's /dev node with a regular file); a folder that
does not exist or where nothing can be created (it creates a file there and removes it:
permission bits say yes to root in /proc or on a read-only mount); an existing regular file
unless `force` (the line names `--force`). Nothing is created when it refuses.
`write_output(path, write, flag)` calls `write(tmp)` with a temporary path beside `path` and
renames it onto `path`; `replacing(path, flag)` is the same as a `with` block. Whatever goes wrong
while writing (an OSError, safetensors' own error, torch.save's RuntimeError) becomes one
InputError line naming the flag.

`ClipFiles(save=, gif=, force=, compare_to=)`: the files of a `cpcourse generate` clip, declared
once (the fields are the command's flags, with the help and the mode each acts in, as a
Request's are). Made before any process starts, it checks each output as above and that --gif is
neither --save nor its .json report; `load_compare()` reads the --compare-to tensor before the
run; `write(res, out, gif_writer)` writes --gif and --save (the tensor, then its report) after
it. The GIF writer is passed in (`cpcourse.viz.clips.save_gif`): drawing is `viz`'s, above this.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cpcourse.support.errors import InputError, require
from cpcourse.support.request import flag

if TYPE_CHECKING:  # torch loads only where a clip is read or saved
    import torch


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _where(flag: str | None, path: str) -> str:
    return f"{flag} {path}" if flag else path


def _not_special(path: str, where: str) -> bool:
    """True when a regular file is at `path`, False when nothing is; else an InputError (a link,
    a folder, a device, a pipe or a socket is never replaced by a rename)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    require(not stat.S_ISLNK(st.st_mode), f"{where} is a symbolic link: give the path of a "
            "regular file (a write would replace the link, not write through it)")
    require(not stat.S_ISDIR(st.st_mode), f"{where} is a directory: give a file name in it")
    require(stat.S_ISREG(st.st_mode), f"{where} is a device or other special file, not a "
            "regular file: give a file path")
    return True


def check_output(path: str, force: bool = False, flag: str | None = None) -> str:
    """The absolute `path`, once it is safe to write (see the module docstring); else an
    InputError naming `flag`. Call it before the work whose result goes to `path`."""
    where = _where(flag, path)
    require(isinstance(path, str) and path.strip() != "", f"{flag or 'path'} needs a file name")
    require(not path.endswith(("/", os.sep)), f"{where} is a directory name (it ends in a "
            "slash): give a file name")
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    exists = _not_special(target, where)
    require(not exists or force, f"{where} already exists: add --force to replace it, or give "
            "another name")
    require(os.path.isdir(folder), f"{where}: the folder {folder} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", dir=folder)
    except OSError as exc:
        raise InputError(f"{where}: cannot create a file in {folder} ({_reason(exc)}): "
                         "give a path in a folder you can write") from None
    os.close(fd)
    os.remove(probe)
    return target


def check_writable(flag: str, path: str) -> str:
    """`check_output(path, force=True, flag)`: for callers that replace a file on purpose."""
    return check_output(path, force=True, flag=flag)


def _mode(path: str, exists: bool) -> int:
    if exists:
        return stat.S_IMODE(os.stat(path).st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def replacing(path: str, name: str | None = None):
    """Yield a temporary path beside `path` to write; when the block ends, rename it onto
    `path`, which must be a regular file or nothing (checked again here, not only before the
    work). On any failure the temporary file is removed, `path` is left as it was, and the
    InputError names `name` (the flag or parameter that gave `path`) when given."""
    where = _where(name, path)
    exists = _not_special(path, where)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.",
                                   dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
        yield tmp
        os.chmod(tmp, _mode(path, exists))
        os.replace(tmp, path)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001  every writer's failure reads the same to a user
        raise InputError(f"{where}: cannot write it ({_reason(exc)})") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)


def write_output(path: str, write: Callable[[str], object], flag: str | None = None) -> str:
    """Call `write(tmp)` to fill a temporary file beside `path`, then rename it onto `path`
    (see `replacing`). Returns `path`. `check_output` passed it before the work."""
    with replacing(path, flag) as tmp:
        write(tmp)
    return path


def write_text(path: str, text: str, flag: str | None = None) -> str:
    """`write_output` for a text (a JSON report, a data file)."""
    def put(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)
    return write_output(path, put, flag)


def data_file_main(argv: list[str] | None, prog: str, out: str, make_text) -> int:
    """The command line of a tool that derives one of cpcourse's data files: unknown arguments
    are refused (exit 2, one line); `make_text()` derives the file's text, written only with
    `--write`; without it the tool says whether the file on disk is already that text (exit 0)
    or not (exit 1), and writes nothing."""
    import sys

    from cpcourse.support.errors import ArgumentParser

    parser = ArgumentParser(prog=prog, description=f"derive {os.path.basename(out)}")
    parser.add_argument("--write", action="store_true",
                        help=f"rewrite {out} (else only compare with it)")
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except InputError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    text = make_text()
    if args.write:
        write_text(out, text, "--write")
        print(f"wrote {out}")
        return 0
    same = os.path.isfile(out) and open(out).read() == text
    print(f"{out}: {'unchanged' if same else 'differs'} (add --write to rewrite it)")
    return 0 if same else 1


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
        import torch

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
    import json

    import torch

    with replacing(path, "--save") as tmp_pt:
        torch.save(tensor, tmp_pt)
        with replacing(path + ".json", "--save") as tmp_json, open(tmp_json, "w") as fh:
            json.dump(report, fh, indent=1, allow_nan=False)
