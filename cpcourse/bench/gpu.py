"""cpcourse bench gpu [--dry-run] ...: the prepared GPU check, run from the checkout it lives in.

    cpcourse bench gpu --dry-run --json     # = python -m tools.gpu_check --dry-run --json

The check is a one-off measurement, not a lesson, so its code lives in `tools/gpu_check/` of the
repository (its docstring lists the parts and flags). This command finds that folder beside the
installed package (an editable install from a clone: `make setup`) and runs it in a child
process with the same arguments, in this folder; its exit status is the check's own (2 and one
line on stderr without CUDA and without --dry-run). Without a checkout it says where to get one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cpcourse.support.errors import InputError

ROOT = Path(__file__).resolve().parents[2]  # cpcourse/bench/gpu.py -> the checkout
CHECK = ROOT / "tools" / "gpu_check"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not (CHECK / "check.py").is_file():
        raise InputError(f"the GPU check lives in tools/gpu_check/ of the course's repository, "
                         f"not in an installed cpcourse ({ROOT} has no tools/gpu_check): clone "
                         f"the repository and run `make gpu` (or `python -m tools.gpu_check`) "
                         f"there")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "tools.gpu_check", *argv], env=env).returncode
