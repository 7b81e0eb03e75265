"""cpcourse: context parallelism for video diffusion transformers, taught by running it.

    python -c "import cpcourse; print(cpcourse.__version__)"

Submodules are imported lazily so that `import cpcourse` stays cheap in a notebook kernel
and never touches CUDA or torch.distributed.
"""

from __future__ import annotations

import importlib
import os

__version__ = "0.1.0"


def _inductor_cache() -> None:
    """Importing diffusers makes torch's compile cache, by default `$TMPDIR/torchinductor_USER`,
    left behind after every run: point it, once and on purpose, into the user's cache directory
    ($XDG_CACHE_HOME or ~/.cache, as pip and torch's own hub do), unless the user chose one or
    that directory cannot be written."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    near = base
    while not os.path.exists(near) and os.path.dirname(near) != near:
        near = os.path.dirname(near)
    if os.path.isdir(near) and os.access(near, os.W_OK | os.X_OK):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                              os.path.join(base, "cpcourse", "torchinductor"))


_inductor_cache()

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
