"""The `%%torchrun` cell magic: a notebook cell's code on P ranks, through `launch()`.

    %load_ext cpcourse

Then a cell starting with `%%torchrun -n 4 [--timeout S] [--threads T] [--out NAME]` runs the
cell's code on 4 ranks, with `rank`, `world_size`, `torch` and `dist` predefined; `--out` keeps
the per-rank `RESULT` list in a notebook variable. A failing rank's traceback names the cell.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from cpcourse.launch.errors import LaunchError, RankError
from cpcourse.launch.launcher import RankResults, launch


def _magic_parser():
    from cpcourse.support.errors import ArgumentParser

    p = ArgumentParser(prog="%%torchrun", add_help=False)
    p.add_argument("-n", "--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="store the per-rank RESULT list in this variable")
    return p


def torchrun_cell(line: str, cell: str, user_ns: dict | None = None) -> RankResults:
    """Run a cell's code on `-n` ranks (what `%%torchrun` calls)."""
    import shlex

    opts = _magic_parser().parse_args(shlex.split(line))
    cell_dir = tempfile.mkdtemp(prefix="cpcourse-cell-")
    path = os.path.join(cell_dir, "torchrun_cell.py")
    with open(path, "w") as fh:
        fh.write(cell)
    try:
        results = launch(path, opts.nproc, timeout=opts.timeout, threads=opts.threads)
    except LaunchError as exc:
        if isinstance(exc, RankError):
            raise exc.renamed(path, "<%%torchrun cell>") from None
        exc.args = (exc.args[0].replace("torchrun_cell.py", "<%%torchrun cell>"),)
        raise exc from None
    finally:
        shutil.rmtree(cell_dir, ignore_errors=True)
    if opts.out and user_ns is not None:
        user_ns[opts.out] = results
    return results


def register_magics(ipython) -> None:
    """Register `%%torchrun` on an IPython shell (called by `%load_ext cpcourse`)."""

    def torchrun(line, cell):
        torchrun_cell(line, cell, ipython.user_ns)

    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
