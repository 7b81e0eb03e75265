"""How `launch()` runs its target on every rank: one frozen `RankCall`, checked by launch().

    python -m pytest tests/unit/test_launch_parts.py -q

`cpcourse.launch.launcher` (ranks it starts) and `cpcourse.launch.torchrun` (a rank of the
user's own torchrun) both read it, so the eight settings are spelled once.
"""

from __future__ import annotations

from dataclasses import dataclass


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
