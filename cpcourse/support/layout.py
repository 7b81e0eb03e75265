"""A layout: how P ranks are split into cfg x ring x ulysses x tp, as arithmetic only.

    python -c "from cpcourse.support.layout import layouts; print(*layouts(8, heads=12))"

`Layout`, the layouts of a world and `check_layout` are shared by the mesh that builds process
groups (`cpcourse.mesh`, notebook 09) and the planner that costs layouts (`cpcourse.planner`), so
they live here, with no process groups: the planner loads without `torch.distributed`. The meaning
of each dim is in `cpcourse.mesh`'s docstring.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from cpcourse.support.errors import InputError, positive_int, require

DIMS = ("cfg", "ring", "ulysses", "tp")
MAX_WORLD = 4096  # ranks in one layout: the planner enumerates every layout up to it


@dataclass(frozen=True)
class Layout:
    """Degrees of the four mesh dims; their product is the world size. `attn2d` = "RxC" (the
    planner only): the ring dim's R x C ranks run Attention2D on that grid instead of a ring
    (`cpcourse.tiling`), so ring = R x C."""

    cfg: int = 1
    ring: int = 1
    ulysses: int = 1
    tp: int = 1
    attn2d: str | None = None

    def __post_init__(self):
        if self.attn2d is not None:
            m = re.fullmatch(r"(\d{1,4})x(\d{1,4})", str(self.attn2d))
            require(m is not None and min(int(m.group(1)), int(m.group(2))) >= 1,
                    f"attn2d must be RxC, e.g. 3x3, got {self.attn2d!r}")
            require(int(m.group(1)) * int(m.group(2)) == self.ring, f"attn2d {self.attn2d} "
                    f"needs ring = {int(m.group(1)) * int(m.group(2))} ranks, got ring={self.ring}")
        for name in DIMS:
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool)
                    and 1 <= value <= MAX_WORLD, f"layout {name} must be a whole number from 1 "
                    f"to {MAX_WORLD}, got {value!r}")
        require(self.cfg in (1, 2), f"cfg must be 1 or 2 (the conditional and unconditional "
                f"passes are two), got {self.cfg}")

    @property
    def world(self) -> int:
        return self.cfg * self.ring * self.ulysses * self.tp

    @property
    def cp(self) -> int:
        """Ranks the frames are split over: ring x ulysses."""
        return self.ring * self.ulysses

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.cfg, self.ring, self.ulysses, self.tp)

    @property
    def grid(self) -> tuple[int, int] | None:
        """(rows, cols) of the Attention2D grid, or None (a ring, or no CP axis)."""
        if self.attn2d is None:
            return None
        rows, cols = self.attn2d.split("x")
        return int(rows), int(cols)

    def as_dict(self) -> dict:
        out = asdict(self)
        if self.attn2d is None:  # the four dims, as before Attention2D
            del out["attn2d"]
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of global `rank`: {"cfg": c, "ring": r, "ulysses": u, "tp": t}."""
        require(0 <= rank < self.world, f"rank {rank} is not in a layout of {self.world} ranks")
        out, rest = {}, rank
        for name, size in reversed(list(zip(DIMS, self.shape, strict=True))):
            out[name], rest = rest % size, rest // size
        return {name: out[name] for name in DIMS}

    def __str__(self) -> str:
        parts = [f"attn2d {self.attn2d}" if n == "ring" and self.attn2d
                 else f"{n}{getattr(self, n)}" for n in DIMS if getattr(self, n) > 1]
        return " x ".join(parts) or "one rank"

    @classmethod
    def parse(cls, text: str, attn2d: bool = False) -> Layout:
        """"cfg=2,ulysses=2" -> Layout(cfg=2, ulysses=2); dims left out are 1. With `attn2d`
        (the planner), "attn2d=3x3" replaces the ring by a 3x3 Attention2D grid (ring = 9)."""
        require(isinstance(text, str) and text.strip(),
                "layout: give dims as cfg=C,ring=R,ulysses=U,tp=T (any subset)")
        values: dict = {}
        for part in text.split(","):
            grid = re.fullmatch(r"\s*attn2d\s*=\s*(\d{1,4})\s*x\s*(\d{1,4})\s*", part)
            if grid is not None:
                require(attn2d, f"layout {text!r}: attn2d is priced by `cpcourse plan` only; "
                        "processes run it in `cpcourse bench tiling`")
                require("attn2d" not in values and "ring" not in values,
                        f"layout {text!r}: give attn2d=RxC or ring=N, once")
                rows, cols = int(grid.group(1)), int(grid.group(2))
                values.update(attn2d=f"{rows}x{cols}", ring=rows * cols)
                continue
            m = re.fullmatch(r"\s*([a-z]+)\s*=\s*(\d{1,4})\s*", part)
            require(m is not None and m.group(1) in DIMS,
                    f"layout {text!r}: each part must be NAME=N with NAME one of "
                    f"{', '.join(DIMS)}" + (" (or attn2d=RxC)" if attn2d else "")
                    + f", got {part.strip()!r}")
            require(m.group(1) not in values, f"layout {text!r}: {m.group(1)} given twice")
            values[m.group(1)] = int(m.group(2))
        return cls(**values)

    @classmethod
    def for_ranks(cls, layout, nproc: int | None) -> Layout:
        """`layout` (a Layout, "cfg=2,ring=2" or a dict of dims) as a Layout of `nproc` ranks
        (None: its own world), or an InputError saying which nproc it needs."""
        layout = cls(**layout) if isinstance(layout, dict) else layout
        layout = cls.parse(layout) if isinstance(layout, str) else layout
        require(nproc is None or layout.world == nproc, f"layout {layout} needs "
                f"{layout.world} ranks: pass nproc={layout.world} (or leave `nproc` out)")
        return layout


def divisors(n: int) -> list[int]:
    """Every whole number that divides `n`, smallest first."""
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(world: int, heads: int | None = None, cfg: bool = True) -> list[Layout]:
    """Every layout of `world` ranks whose Ulysses x TP degree divides `heads` (when given);
    `cfg=False` (a guidance-distilled model: one forward per step) keeps cfg at 1."""
    require(isinstance(world, int) and 1 <= world <= MAX_WORLD,
            f"world must be a whole number from 1 to {MAX_WORLD}, got {world!r}")
    heads = _heads(heads)
    found = []
    for c in ((1, 2) if cfg else (1,)):
        if world % c:
            continue
        for t in divisors(world // c):
            for u in divisors(world // (c * t)):
                if heads is None or heads % (u * t) == 0:
                    found.append(Layout(cfg=c, ring=world // (c * t * u), ulysses=u, tp=t))
    return found


def _heads(heads):
    """None, or a whole number > 0: heads=0 divides by everything, so every layout passed."""
    return None if heads is None else positive_int("heads", heads)


def _listing(options: list[Layout], limit: int = 8) -> str:
    text = "; ".join(str(o) for o in options[:limit])
    return text + (f"; and {len(options) - limit} more" if len(options) > limit else "")


def with_attn2d(layout: Layout) -> list[Layout]:
    """The layout with its ring of R ranks run as each Attention2D grid of R with both sides
    >= 2 (a side of 1 is the all-gather, not a grid): ring=9 -> attn2d 3x3; ring=8 -> 2x4, 4x2."""
    r = layout.ring
    return [Layout(cfg=layout.cfg, ring=r, ulysses=layout.ulysses, tp=layout.tp,
                   attn2d=f"{a}x{r // a}") for a in divisors(r) if 2 <= a <= r // 2]


def check_layout(layout: Layout, world: int | None = None, heads: int | None = None) -> Layout:
    """The layout, or an InputError naming what to change and the layouts that would work."""
    heads = _heads(heads)
    if world is not None and layout.world != world:
        raise InputError(
            f"layout {layout} needs {layout.world} ranks but the world has {world}: the degrees "
            f"must multiply to the world size, e.g. {_listing(layouts(world, heads))}")
    if heads is not None and heads % (layout.ulysses * layout.tp):
        raise InputError(
            f"layout {layout}: ulysses x tp = {layout.ulysses * layout.tp} does not divide the "
            f"{heads} heads (Ulysses and TP both split heads); layouts of {layout.world} ranks "
            f"that work: {_listing(layouts(layout.world, heads))} (the ring has no head limit)")
    return layout
