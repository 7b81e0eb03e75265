"""python -m cpcourse ARGS: the `cpcourse` command, also as a torchrun module (`torchrun ... -m
cpcourse demo --nproc 4`)."""

import sys

from cpcourse.cli import main

sys.exit(main())
