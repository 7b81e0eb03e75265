"""`python -m tools.gpu_check [--dry-run] [--json] ...`: the GPU check's command line.

Bad input (no CUDA without --dry-run, an --out that exists) is one line on stderr and exit 2,
as every cpcourse command does.
"""

from __future__ import annotations

import sys

from cpcourse.support.errors import InputError
from tools.gpu_check import check


def main(argv: list[str]) -> int:
    try:
        return check.main(argv)
    except InputError as exc:
        print(f"cpcourse bench gpu: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
