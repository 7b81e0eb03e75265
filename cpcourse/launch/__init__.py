"""Launching ranks: `launch()` and `%%torchrun`, the rank entry, launch errors, the process tree.

    python -c "import cpcourse; print(cpcourse.launch('cpcourse.launch.entry:rank_info', 2))"

Machinery, not a lesson: the course's distributed code (`cpcourse.ring`, `cpcourse.ulysses`,
`cpcourse.video`, ...) runs on the ranks this package starts. `launcher` starts torchrun and
`watch` follows its ranks and collects their results (inside the user's own torchrun rank,
`torchrun` runs the target in place instead), `magic` is the `%%torchrun` cell magic, `entry` is
what each rank runs, `errors` turns a failing or stuck rank into an exception that names it,
`proctree` ends every process a launch started.
"""

from __future__ import annotations

import sys
import types

from cpcourse.launch.errors import LaunchError, LaunchTimeout, RankError
from cpcourse.launch.launcher import DEFAULT_TIMEOUT_S, RankResults, launch
from cpcourse.launch.magic import register_magics, torchrun_cell
from cpcourse.launch.torchrun import RankDone, TorchrunRank, torchrun_rank
from cpcourse.support.request import MAX_NPROC, check_nproc

__all__ = ["DEFAULT_TIMEOUT_S", "MAX_NPROC", "LaunchError", "LaunchTimeout", "RankError",
           "RankDone", "RankResults", "TorchrunRank", "check_nproc", "launch", "register_magics",
           "torchrun_cell", "torchrun_rank"]


class _CallableModule(types.ModuleType):
    """`cpcourse.launch(...)` must call the function even after `import cpcourse.launch` made
    the attribute `cpcourse.launch` this package (the package and the function share a name)."""

    def __call__(self, *args, **kwargs):
        return launch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
