"""Files a command writes: refused before any work when they cannot be written, and written
through a temporary file renamed into place, so a failure leaves no half-written file.

    cpcourse train --out /proc/x.safetensors --steps 1   # exit 2 at once, nothing trained

`check_writable(flag, path)` creates a file beside `path` and removes it. Permission bits
(`os.access`) say yes to root in /proc, on a read-only mount or a full disk; only a real
create tells. `replacing(path, name)` yields a temporary path beside `path` and renames it onto
`path` when the block ends; whatever goes wrong while writing (an OSError, safetensors' own
error, torch.save's RuntimeError) becomes one InputError line naming the flag.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from cpcourse.support.errors import InputError, require


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def check_writable(flag: str, path: str) -> str:
    """The absolute `path`, once a file could be created beside it; else an InputError that
    names `flag`. Call it before the work whose result goes to `path`."""
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    require(not os.path.isdir(target), f"{flag} {path} is a directory: give a file name in it")
    require(os.path.isdir(folder), f"{flag} {path}: the folder {folder} does not exist")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", dir=folder)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot create a file in {folder} ({_reason(exc)}): "
                         "give a path in a folder you can write") from None
    os.close(fd)
    os.remove(probe)
    return target


@contextlib.contextmanager
def replacing(path: str, name: str | None = None):
    """Yield a temporary path beside `path` to write; when the block ends, rename it onto
    `path`. On any failure the temporary file is removed, `path` is left as it was, and the
    InputError names `name` (the flag or parameter that gave `path`) when given."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001  every writer's failure reads the same to a user
        where = f"{name} {path}" if name else path
        raise InputError(f"{where}: cannot write it ({_reason(exc)})") from None
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)
