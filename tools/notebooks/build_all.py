"""python tools/notebooks/build_all.py [--check]: (re)build every notebook from its builder.

    make notebooks

Runs each tools/notebooks/build_NN.py in turn; `--check` exits 1 when any committed notebook
differs from what its builder writes (the notebook tests run this).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE))
    status = 0
    for script in sorted(HERE.glob("build_[0-9]*.py")):
        module = runpy.run_path(str(script))
        status |= module["main"](argv)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
