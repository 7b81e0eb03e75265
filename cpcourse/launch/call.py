"""How `launch()` runs its target on every rank: one frozen `RankCall`, checked by launch().

    python -m pytest tests/unit/test_launch_parts.py -q

`cpcourse.launch.launcher` (ranks it starts) and `cpcourse.launch.torchrun` (a rank of the
user's own torchrun) both read it, so the eight settings are spelled once. `RankSpec` is the
part each started rank reads back from its run folder (`spec.json`), by field.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RankCall:
    """How `launch()` runs its target on every rank, checked by launch(): the target's `args`
    and `kwargs`, the ranks' extra `env`, torch `threads` per rank, the process group's
    `pg_timeout` and `backend` (None: chosen by the GPUs present), whether the group is
    initialised before the target (`init`), and where rank output goes (`stream`)."""

    args: tuple = ()
    kwargs: dict | None = None
    env: dict | None = None
    threads: int | None = None
    pg_timeout: float = 30.0
    backend: str | None = None
    init: bool = True
    stream: object = True


@dataclass(frozen=True)
class RankSpec:
    """What every rank the launcher starts reads from `RUN_DIR/spec.json` before it runs its
    target: the `target` ("module:function", "path/file.py:function" or a file), torch
    `threads` per rank, whether the process group is initialised first (`init`), and its
    `backend` (None: chosen by the GPUs present). JSON, so the fork server can read the target
    without unpickling anything (the target's arguments travel in `args.pkl`)."""

    target: str
    threads: int = 1
    init: bool = True
    backend: str | None = None

    def write(self, run_dir: str) -> None:
        with open(os.path.join(run_dir, "spec.json"), "w") as fh:
            json.dump(asdict(self), fh)

    @classmethod
    def read(cls, run_dir: str) -> RankSpec:
        with open(os.path.join(run_dir, "spec.json")) as fh:
            return cls(**json.load(fh))
