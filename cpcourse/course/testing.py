"""assert_close: a comparison whose failure says where, by how much, and what to look at.

    python -m pytest tests/unit/test_testing.py

A bare `allclose` says only "False". `assert_close` names the worst element, maps its index to
the coordinates a learner thinks in (batch, head, sequence position -> rank, frame, row, column),
prints expected vs got, the largest absolute and relative errors, how many elements fail and
where they cluster, then the exercise's hint.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import torch

# Default (rtol, atol) by the least precise dtype compared (torch.testing's defaults).
TOLERANCES = {
    torch.float64: (1e-7, 1e-7), torch.float32: (1.3e-6, 1e-5),
    torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
}
_PRECISION = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _as_tensor(x, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    try:
        return torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        raise AssertionError(f"{what} is a {type(x).__name__}, not a number or tensor: "
                             f"{x!r:.200}") from None


def _default_tol(a: torch.Tensor, e: torch.Tensor) -> tuple[float, float]:
    floats = [t.dtype for t in (a, e) if t.is_floating_point() or t.is_complex()]
    if not floats:
        return 0.0, 0.0  # integers and booleans compare exactly
    worst = max(floats, key=lambda d: _PRECISION.index(d) if d in _PRECISION else 1)
    return TOLERANCES.get(worst, TOLERANCES[torch.float32])


def _fmt(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:.7g}"


def _shape(t: torch.Tensor, dims) -> str:
    sizes = list(t.shape)
    if dims and len(dims) == len(sizes):
        return "[" + ", ".join(f"{d}={s}" for d, s in zip(dims, sizes, strict=True)) + "]"
    return str(sizes)


def _describe_coords(index: tuple[int, ...], dims, coords) -> str:
    parts = []
    if dims:
        parts.append(", ".join(f"{d}={i}" for d, i in zip(dims, index, strict=False)))
    extra = None
    if callable(coords):
        extra = coords(index)
    elif isinstance(coords, Mapping):
        names = list(dims or [])
        mapped = []
        for key, fn in coords.items():
            pos = names.index(key) if key in names else key
            if not isinstance(pos, int) or pos >= len(index):
                raise ValueError(f"coords key {key!r} is not one of dims {dims}")
            mapped.append(fn(index[pos]))
        extra = mapped
    for piece in ([] if extra is None else extra if isinstance(extra, list) else [extra]):
        if isinstance(piece, Mapping):
            parts.append(", ".join(f"{k} {v}" for k, v in piece.items()))
        else:
            parts.append(str(piece))
    return " -> ".join(parts)


def _clusters(bad: torch.Tensor, dims) -> str:
    """For each dimension, the range of indices holding failures ("L 512..767 of 1024")."""
    spans = []
    for axis, size in enumerate(bad.shape):
        if size <= 1:
            continue
        other = tuple(a for a in range(bad.ndim) if a != axis)
        hit = bad.any(dim=other) if other else bad
        idx = hit.nonzero().flatten()
        name = dims[axis] if dims and axis < len(dims) else f"dim {axis}"
        if len(idx) == size:
            spans.append(f"{name} all {size}")
        else:
            lo, hi = int(idx.min()), int(idx.max())
            where = f"{lo}" if lo == hi else f"{lo}..{hi}"
            spans.append(f"{name} {where} ({len(idx)} of {size})")
    return "; ".join(spans)


def assert_close(actual, expected, *, atol: float | None = None, rtol: float | None = None,
                 dims: Sequence[str] | None = None,
                 coords: Callable | Mapping[str, Callable] | None = None,
                 hint: str | None = None, name: str | None = None) -> None:
    """Raise AssertionError, with a report, unless |actual - expected| <= atol + rtol * |expected|.

    actual, expected: torch tensors (any dtype, any device; compared in float64) or numbers.
    atol, rtol: default by the least precise dtype (float32: 1e-5, 1.3e-6; bf16: 1e-5, 1.6e-2;
        integers: exact). NaN matches NaN; +-inf match themselves.
    dims: a name per dimension, e.g. ("B", "H", "L", "D").
    coords: maps the worst index to coordinates a learner thinks in: a callable taking the
        index tuple, or {dim name: callable(position)}; each returns a dict such as
        {"rank": 2, "frame": 4} or a string. See `sequence_coords` for the usual one.
    hint: printed last: what to check. name: what is being compared ("out", "lse").
    """
    label = name or "value"
    a, e = _as_tensor(actual, f"{label} (got)"), _as_tensor(expected, f"{label} (expected)")
    if a.shape != e.shape:
        msg = f"{label}: shape {_shape(a, dims)}, expected {_shape(e, dims)}"
        raise AssertionError(msg + (f"\n  hint: {hint}" if hint else ""))
    d_rtol, d_atol = _default_tol(a, e)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    a64, e64 = a.to(torch.float64), e.to(torch.float64)
    diff = (a64 - e64).abs()
    allowed = atol + rtol * e64.abs()
    same = (a64 == e64) | (a64.isnan() & e64.isnan())
    bad = ~same & ~(diff <= allowed)  # NaN differences count as failures
    n_bad = int(bad.sum())
    if n_bad == 0:
        return
    excess = torch.where(bad, diff.nan_to_num(math.inf) / allowed.clamp_min(1e-300),
                         torch.zeros_like(diff))
    flat = int(torch.argmax(excess.flatten()))
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    got, want = a64[index].item(), e64[index].item()
    finite_bad = bad & diff.isfinite()
    any_finite = bool(finite_bad.any())
    max_abs = diff[finite_bad].max().item() if any_finite else math.inf
    rel = diff / e64.abs().clamp_min(1e-300)
    max_rel = rel[finite_bad].max().item() if any_finite else math.inf
    total = a.numel()
    if a.ndim == 0:
        head = f"{label}: expected {_fmt(want)}, got {_fmt(got)}"
    else:
        where = _describe_coords(index, dims, coords)
        head = (f"{label}: {n_bad:,} of {total:,} elements differ ({100 * n_bad / total:.3g}%)"
                f" beyond atol={atol:g}, rtol={rtol:g}\n"
                f"  worst at index {list(index)}" + (f" ({where})" if where else "") + "\n"
                f"    expected {_fmt(want)}, got {_fmt(got)}")
    lines = [head,
             f"  abs err {_fmt(abs(got - want))}" if a.ndim == 0 else
             f"  max abs err {max_abs:.3g}, max rel err {max_rel:.3g} (atol={atol:g}, "
             f"rtol={rtol:g})"]
    n_nan = int((a64.isnan() & ~e64.isnan()).sum())
    if n_nan:
        lines[-1] += f"; {n_nan:,} NaN where a number was expected"
    if a.ndim > 0 and total > 1:
        lines.append(f"  failures span: {_clusters(bad, dims)}")
    if a.ndim == 0 and (atol or rtol):
        lines[-1] += f" (atol={atol:g}, rtol={rtol:g})"
    if hint:
        lines.append(f"  hint: {hint}")
    raise AssertionError("\n".join(lines))


def shard_bounds(length: int, world_size: int) -> list[tuple[int, int]]:
    """[start, stop) of each rank's shard, split like torch.tensor_split (first ranks +1)."""
    base, extra = divmod(length, world_size)
    out, start = [], 0
    for r in range(world_size):
        stop = start + base + (1 if r < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def sequence_coords(length: int, world_size: int | None = None,
                    grid: tuple[int, int, int] | None = None) -> Callable[[int], dict]:
    """position -> {"rank", "offset", "frame", "row", "col"} for a flattened (t, h, w) sequence.

    Use as `coords={"L": sequence_coords(L, world_size=P, grid=(T, Hp, Wp))}`: the rank holds
    the position under the contiguous tensor_split sharding; the grid maps it to a token's frame,
    row and column in (t, h, w) order.
    """
    bounds = shard_bounds(length, world_size) if world_size else None

    def where(pos: int) -> dict:
        out = {}
        if bounds:
            rank = next(r for r, (lo, hi) in enumerate(bounds) if lo <= pos < hi)
            out.update(rank=rank, offset=pos - bounds[rank][0])
        if grid:
            _, h, w = grid
            out.update(frame=pos // (h * w), row=pos // w % h, col=pos % w)
        return out

    return where

