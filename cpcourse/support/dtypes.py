"""Element types: one table, one spelling (`fp64`, `fp32`, `bf16`, `fp16`), as `--dtype` takes them.

    python -c "from cpcourse.support.dtypes import nbytes; print(nbytes('bf16'))"

The planner counts bytes with `nbytes` and loads without torch; code that builds tensors asks
`torch_dtype`. torch's own names (`float32`, the spelling of the data files and of `cpcourse
models --dtype`) are read as aliases of the same four entries.
"""

from __future__ import annotations

from cpcourse.support.errors import InputError

BYTES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2}
TORCH_NAMES = {"fp64": "float64", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_ALIASES = {torch_name: short for short, torch_name in TORCH_NAMES.items()}


def canonical(name: str, choices=tuple(BYTES)) -> str:
    """`name` in the table's spelling ("float32" -> "fp32"), or an InputError naming `choices`."""
    short = _ALIASES.get(name, name) if isinstance(name, str) else name
    if short not in choices:
        raise InputError(f"dtype must be one of {', '.join(choices)}, got {name!r}")
    return short


def nbytes(name: str) -> int:
    """Bytes of one element of `name` ("bf16" or "bfloat16" -> 2)."""
    return BYTES[canonical(name)]


def torch_dtype(name: str):
    """The torch dtype of `name` ("fp32" or "float32" -> torch.float32)."""
    import torch

    return getattr(torch, TORCH_NAMES[canonical(name)])
