"""cpcourse: context parallelism for video diffusion transformers, taught by running it.

    python -c "import cpcourse; print(cpcourse.__version__)"

Submodules are imported lazily so that `import cpcourse` stays cheap in a notebook kernel
and never touches CUDA or torch.distributed.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {"check": ("cpcourse.course", "check"), "launch": ("cpcourse.launch", "launch"),
         "exercise": ("cpcourse.course", "exercise"),
         "use_reference": ("cpcourse.course", "use_reference"),
         "hint": ("cpcourse.course.hints", "hint")}


def __getattr__(name: str):
    if name in _LAZY:
        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'cpcourse' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """`%load_ext cpcourse` registers the `%%torchrun` cell magic."""
    from cpcourse.launch import register_magics

    register_magics(ipython)
