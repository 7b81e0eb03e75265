"""python -m cpcourse.cli ARGS: the `cpcourse` command without the installed script."""

import sys

from cpcourse.cli import main

sys.exit(main())
